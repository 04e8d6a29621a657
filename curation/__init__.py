"""Data curation: taggers write per-document attributes, a mixer turns attributes and rules into an arm.

The shape is dolma's: tagging never changes the corpus (`curation.pipeline` writes attributes keyed by a
stable document id into a curation directory, `curation.store`), and `curation.mix` applies rules to the
attributes to write an *arm*: a manifest of the kept documents that `ladder data prepare` reads like any
other. Duplicate clusters (`curation.exact`, `curation.minhash`) are grouped by shuffling keys into
partitions and joined with a distributed connected components (`curation.components`), so no single
process holds more than one partition of the corpus's keys.
"""
