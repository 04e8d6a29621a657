"""Data for one training job: corpus manifests, tokenizers, tokenized shards, decontamination,
the source-scaled sampler and exact bits-per-byte evaluation.

Entry points: `prepare.prepare` / `prepare.ensure_prepared` build shards from a manifest (streaming,
per input file, in this process or on Ray workers: `filework`),
`corpus.PreparedCorpus.open` reads them, `sampler.SourceScaledSampler` streams training batches,
`bpb.evaluate_bpb` scores held-out sets.
"""
