"""How much of the seed noise of a held-out BPB the held-out documents add: would more of them narrow it?

Runs that differ only in their seed, scored on the same held-out documents, scatter for two reasons: the
models differ (one seed's model is better or worse on the whole domain), and each model fits each document
its own way (seed × document interaction). Only the second falls with more held-out documents; the first is
what more seeds average out. The split, per domain, from each run's per-document bits (the final eval's
`doc_bits`, `rungs.evaluation.DomainScore`):

With b̄_i a document's mean bits over the seeds, w_i = b̄_i / Σ b̄ its share of the domain's bits and
r_si = b_si / b̄_i − 1 seed s's relative deviation on it, a seed's log BPB deviates by δ_s ≈ Σ_i w_i r_si
(to first order). The model is r_si = m_s + u_si: m_s the seed's effect on the whole domain (variance σ_m²),
u_si its effect on one document (variance σ_i², independent over documents and seeds). Then

    Var(δ) = σ_m² + Σ_i w_i² σ_i²

and the second term is the documents' part. Each document's residual c_si = r_si − δ_s has variance
σ_i²(1 − 2w_i) + Σ_j w_j² σ_j² over seeds; the sample variances v_i of the c_si give σ² by solving that
linear system (a moment estimator, unbiased to first order), and the documents' part is Σ_i w_i² σ_i². The
model part is Var(δ) minus it. Doubling the held-out documents (drawn like these) halves the documents' part
and leaves the model's. Configurations that differ in more than their seed (a sweep's arms, two seeds each)
are each centred on their own means, and their sums of squares pooled on Σ (seeds − 1) degrees of freedom.

Across domains, the mean of log BPB over D domains has the documents' part Σ_d (their part)/D², since the
domains' documents are distinct; the model's part is whatever is left of the mean's variance.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class HeldOutNoise:
    """One domain's (or the mean over domains') seed noise of log BPB, split. Standard deviations are of
    one seed's log BPB; `documents_share` is the documents' part of the variance."""

    seeds: int
    documents: int
    sd_total: float
    sd_model: float  # NaN where the estimate of the documents' part exceeds the total (noise)
    sd_documents: float

    @property
    def documents_share(self) -> float:
        return self.sd_documents ** 2 / self.sd_total ** 2 if self.sd_total > 0 else float("nan")

    def sd_with_documents(self, factor: float) -> float:
        """One seed's sd of log BPB with `factor` times as many held-out documents (drawn like these)."""
        model = 0.0 if math.isnan(self.sd_model) else self.sd_model ** 2
        return math.sqrt(model + self.sd_documents ** 2 / factor)


def _checked(doc_bits: np.ndarray) -> np.ndarray:
    bits = np.asarray(doc_bits, dtype=np.float64)
    if bits.ndim != 2:
        raise ValueError(f"doc_bits must be seeds x documents, got shape {bits.shape}")
    if bits.shape[1] < 3:
        raise ValueError(f"the split needs at least 3 held-out documents, got {bits.shape[1]}")
    if not np.all(np.isfinite(bits)) or np.any(bits <= 0):
        raise ValueError("doc_bits must be finite and positive (every document scored, every seed)")
    return bits


Groups = np.ndarray | Sequence[np.ndarray]


def _groups(doc_bits: Groups) -> list[np.ndarray]:
    """One seeds × documents array, or several (configurations that differ in more than their seed, scored on
    the same documents: each is centred on its own means and their scatter pooled)."""
    groups = [_checked(doc_bits)] if isinstance(doc_bits, np.ndarray) else [_checked(g) for g in doc_bits]
    if not groups:
        raise ValueError("no runs")
    if len({g.shape[1] for g in groups}) != 1:
        raise ValueError(f"every group needs the same held-out documents, got {sorted({g.shape[1] for g in groups})}")
    groups = [g for g in groups if g.shape[0] >= 2]  # one seed alone says nothing of the scatter
    dof = sum(g.shape[0] - 1 for g in groups)
    if dof < 2:
        raise ValueError(f"the split needs at least 2 degrees of freedom among seeds (3 seeds of one configuration, "
                         f"or 2 of each of two), got {dof}")
    return groups


def _log_deviations(groups: list[np.ndarray]) -> np.ndarray:
    """Each seed's log of its summed bits, centred on its group's mean."""
    return np.concatenate([np.log(g.sum(axis=1)) - np.log(g.sum(axis=1)).mean() for g in groups])


def split_domain(doc_bits: Groups) -> HeldOutNoise:
    """The split for one domain from its per-document bits, seeds × documents (the same documents in the same
    order for every seed), or a list of such arrays pooled. The documents' bytes are not needed: they are the
    same for every seed, so they cancel from each seed's deviation of log BPB."""
    groups = _groups(doc_bits)
    dof = sum(g.shape[0] - 1 for g in groups)
    docs = groups[0].shape[1]
    # the first-order deviations δ_s linearise the exact ones; the total uses the exact log BPB
    total = float(np.sum(_log_deviations(groups) ** 2) / dof)
    w = np.mean([g.mean(axis=0) / g.mean(axis=0).sum() for g in groups], axis=0)
    residual_ss = np.zeros(docs)
    for g in groups:
        mean = g.mean(axis=0)
        share = mean / mean.sum()
        r = g / mean - 1.0
        residual_ss += np.sum((r - (r @ share)[:, None]) ** 2, axis=0)
    system = np.diag(1.0 - 2.0 * w) + np.outer(np.ones(docs), w ** 2)
    sigma2 = np.linalg.solve(system, residual_ss / dof)
    documents = max(float(w ** 2 @ sigma2), 0.0)
    model = total - documents
    return HeldOutNoise(seeds=sum(g.shape[0] for g in groups), documents=docs, sd_total=math.sqrt(total),
                        sd_model=math.sqrt(model) if model >= 0 else float("nan"), sd_documents=math.sqrt(documents))


def split_mean_over_domains(doc_bits: Mapping[str, Groups]) -> HeldOutNoise:
    """The split of the mean of log BPB over the domains (each as `split_domain` takes it, the seeds and
    groups in one order for every domain)."""
    if not doc_bits:
        raise ValueError("no domains")
    per = {d: _groups(b) for d, b in doc_bits.items()}
    shapes = {tuple(g.shape[0] for g in groups) for groups in per.values()}
    if len(shapes) != 1:
        raise ValueError(f"every domain needs the same seeds, got {sorted(shapes)} of them")
    return _mean_over_domains(per, {d: split_domain(gs) for d, gs in per.items()})


def _mean_over_domains(per: Mapping[str, list[np.ndarray]], splits: Mapping[str, HeldOutNoise]) -> HeldOutNoise:
    """`split_mean_over_domains` from the domains' checked groups and their own splits."""
    n = len(per)
    groups = next(iter(per.values()))
    dof = sum(g.shape[0] - 1 for g in groups)
    mean_log = np.mean([_log_deviations(gs) for gs in per.values()], axis=0)
    total = float(np.sum(mean_log ** 2) / dof)
    documents = sum(splits[d].sd_documents ** 2 for d in per) / n ** 2
    model = total - documents
    return HeldOutNoise(seeds=sum(g.shape[0] for g in groups), documents=sum(gs[0].shape[1] for gs in per.values()),
                        sd_total=math.sqrt(total), sd_model=math.sqrt(model) if model >= 0 else float("nan"),
                        sd_documents=math.sqrt(documents))


def split_runs(evals: Sequence[Mapping[str, Sequence[float]]],
               groups: Sequence[Hashable] | None = None) -> dict[str, HeldOutNoise]:
    """The split per domain and for the mean over domains ("all") from runs' per-document bits (each run's
    final eval `doc_bits`: domain → bits per document, eval.json). `groups` labels each run's configuration
    apart from its seed (None: all one); runs of a label are its seeds, and the labels' scatter is pooled."""
    labels = list(groups) if groups is not None else [None] * len(evals)
    if len(labels) != len(evals):
        raise ValueError(f"{len(evals)} runs but {len(labels)} group labels")
    if not evals:
        raise ValueError("no runs")
    domains = sorted(evals[0])
    for e in evals:
        if sorted(e) != domains:
            raise ValueError(f"the runs were scored on different domains: {sorted(e)} and {domains}")
    order = list(dict.fromkeys(labels))
    arrays: dict[str, list[np.ndarray]] = {}
    for d in domains:
        lengths = {len(e[d]) for e in evals}
        if len(lengths) != 1:
            raise ValueError(f"{d}: the runs scored different numbers of documents ({sorted(lengths)}): "
                             "the split needs the same held-out documents for every seed")
        arrays[d] = [np.array([list(e[d]) for e, g in zip(evals, labels) if g == label], dtype=np.float64)
                     for label in order]
    out = {d: split_domain(gs) for d, gs in arrays.items()}
    # every run has every domain, so the domains' groups hold the same seeds: no check beyond split_domain's
    out["all"] = _mean_over_domains({d: _groups(gs) for d, gs in arrays.items()}, out)
    return out


def split_label(by: str, value: Any, sep: str = " ") -> str:
    """A split's name: "rung 3" for `--by rung`; "arm unrouted rung 3" for `--by arm,rung` (a list of values)."""
    columns = by.split(",")
    values = value if isinstance(value, list) else [value]
    return sep.join(f"{c}{sep}{v:g}" if isinstance(v, float) else f"{c}{sep}{v}"
                    for c, v in zip(columns, values, strict=True))
