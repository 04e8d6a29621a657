"""Compute laws of many groups (one per eval domain): which runs they are fitted on, and the set of
results, with the reason for each group that could not be fitted.

`fit_power_laws` is the one step `ladder fit power-law`, `ladder extrapolate --experiment/--csv`,
`ladder demo` (and its report) and the notebooks take, so the same runs give the same laws whichever
command reads them. Two rules decide a law: which rows it is fitted on (`select`) and what an E that
runs to zero becomes (`floor`).

Its row selection (`select`):

- "ladder" (the default): the runs of the sweep's ladder block (column `block` == "ladder"): one
  run per rung at the recipe's TPP with the law's LR/WD. A table without a `block` column is taken
  to be the ladder itself (every row). A table that names blocks but has no ladder rows is refused.
- "best": at each compute value, the run with the lowest metric (the frontier of a sweep).
- "all": every row (repeated seeds of the same rungs, say).

The selected rows are ordered by (group, x, y), so the laws, and their bootstrap intervals, do not
depend on the order the runs were read in.

Why the ladder and not the best run per compute: the law is used to predict the target run, and
that run is trained once, at the recipe's TPP and the law's LR/WD: the ladder's runs are that kind
of run, the best of a grid is not. Only the small rungs sweep LR/WD, so "best" takes a minimum over
9 noisy runs at the bottom and over 1 at the top: the minimum of k runs sits about σ·E[max of k
normals] below their mean (1.5σ for k = 9), which lowers the small rungs only, flattens the law
(α too small) and biases every prediction upwards; the bootstrap cannot see that selection, so the
intervals do not cover it either. On the shipped demo fixture the best run at L3 is 0.026 BPB
(0.8%) below the ladder's own L3 run.

Its floor rule (`floor`, `fits.floors`; the fit's side in `fits.power_law`): "fit" (the default)
refuses a group whose E runs to zero, "auto" gives it the nested law A·C^(−α), reported with E = 0
and flagged `floor_at_zero` (what `ladder demo` fits: a ladder over two decades of compute rarely
shows a floor, and its predictions near the range are identified where E is not), "zero" fixes
E = 0 for every group. The default reports no E the data cannot show; "auto" is asked for by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from fits.errors import FitError, FitInputError
from fits.floors import DEFAULT_FLOOR, FLOOR_RULES, check_floor
from fits.results import jsonable
from fits.validate import check_bootstrap, check_group_values, check_level, numeric_column, require_columns
from provenance import code_version

if TYPE_CHECKING:
    from fits.power_law import PowerLawResult

LADDER_BLOCK = "ladder"
BLOCK_COLUMN = "block"
SELECT_RULES = {
    "ladder": "the ladder block: one run per rung at the recipe's TPP with the law's LR/WD",
    "best": "the best run per compute value",
    "all": "every run",
}
DEFAULT_SELECT = "ladder"


def select_runs(df: pd.DataFrame, x: str, y: str, *, group: str | None = None,
                select: str = DEFAULT_SELECT) -> tuple[pd.DataFrame, dict[str, Any]]:
    """(the rows a compute law is fitted on, a record of how they were chosen)."""
    if select not in SELECT_RULES:
        raise FitInputError(f"select must be one of {sorted(SELECT_RULES)}, got {select!r}")
    info: dict[str, Any] = {"rule": select, "description": SELECT_RULES[select], "n_rows_in": len(df)}
    if select == "ladder" and BLOCK_COLUMN in df.columns:
        chosen = df[df[BLOCK_COLUMN] == LADDER_BLOCK]
        if chosen.empty:
            blocks = sorted(map(str, df[BLOCK_COLUMN].dropna().unique()))
            raise FitInputError(f"no rows of the {LADDER_BLOCK!r} block (blocks here: {blocks}); fit the best run "
                                "per compute (select 'best') or every run (select 'all') instead", column=BLOCK_COLUMN)
    elif select == "ladder":
        chosen = df
        info["description"] += f" (no {BLOCK_COLUMN!r} column: every row is the ladder)"
    elif select == "best":
        for c in (x, y, group):
            if c is not None and c not in df.columns:
                raise FitInputError(f"no such column; the table has {sorted(map(str, df.columns))}", column=c)
        finite = df.dropna(subset=[y])
        numeric_column(finite, y)
        keys = [group, x] if group else [x]
        chosen = finite.loc[finite.groupby(keys)[y].idxmin()] if len(finite) else finite
    else:
        chosen = df
    order = [c for c in (group, x, y) if c is not None and c in chosen.columns]
    if order:  # one order whatever order the runs were read in: the bootstrap resamples rows by position
        chosen = chosen.sort_values(order, kind="stable")
    info["n_rows"] = len(chosen)
    return chosen, info


@dataclass(frozen=True)
class PowerLawSet:
    """One compute law per group, and the reason for each group whose law could not be fitted.
    `rows` are the selected rows (all groups), `selection` how they were chosen."""

    names: tuple[str, ...]  # every group, in the table's order
    laws: dict[str, PowerLawResult]
    errors: dict[str, FitError]
    rows: pd.DataFrame = field(repr=False)
    group: str | None
    x: str
    y: str
    selection: dict[str, Any]
    code_version: str = field(default_factory=code_version)

    @property
    def reasons(self) -> dict[str, str]:
        return {g: str(err) for g, err in self.errors.items()}

    def rows_of(self, name: str) -> pd.DataFrame:
        """The selected rows of one group (the whole selection when there is no group column)."""
        return self.rows if self.group is None else self.rows[self.rows[self.group].astype(str) == name]

    def to_dict(self, include_draws: bool = False) -> dict[str, Any]:
        return jsonable({"group": self.group, "x": self.x, "y": self.y, "selection": self.selection,
                         "laws": {g: law.to_dict(include_draws) for g, law in self.laws.items()},
                         "not_fitted": self.reasons, "code_version": self.code_version})

    def summary(self) -> str:
        lines = [f"{len(self.laws)} of {len(self.names)} compute laws fitted on {self.selection['description']}"]
        for name in self.names:
            lines.append(self.laws[name].summary() if name in self.laws else f"{name}: not fitted: {self.errors[name]}")
        return "\n".join(lines)

    def conf_int(self, level: float | None = None) -> dict[str, dict[str, tuple[float, float]]]:
        """Each fitted group's parameter intervals at `level`, from its bootstrap draws."""
        return {g: law.conf_int(level) for g, law in self.laws.items()}


def check_distinct_runs(rows: pd.DataFrame, group: str | None, id_column: str | None) -> None:
    """One row per run (per group): a run listed twice (two exports concatenated, a fixture read twice) would count
    as a repeated seed of itself, a seed scatter of exactly 0 that narrowed every interval (±2.5% to ±1.5% on the
    demo); refused naming the run."""
    if not id_column or id_column not in rows.columns:
        return
    keys = [group, id_column] if group is not None else [id_column]
    repeated = rows[rows.duplicated(keys, keep=False) & rows[id_column].notna()]
    if len(repeated):
        first = repeated.iloc[0]
        where = f" (group {first[group]!r})" if group is not None else ""
        raise FitInputError(f"run {first[id_column]!r} appears {int((rows[keys] == first[keys]).all(axis=1).sum())} times"
                            f"{where}; each run is one row (a run read twice would count as its own repeated seed)",
                            column=id_column)


def fit_power_laws(df: pd.DataFrame, x: str = "train_flops", y: str = "bpb", *, group: str | None = "domain",
                   select: str = DEFAULT_SELECT, floor: str = DEFAULT_FLOOR, **fit_options: Any) -> PowerLawSet:
    """Select the rows (`select`, module docstring), then fit y = E + A·x^(−α) per value of `group`
    (one law labelled `y` with group=None), with the floor rule `floor` (module docstring). A group
    whose law cannot be fitted (no floor in its data under floor "fit", too few or too narrow rungs, a
    bootstrap that cannot run) is kept with its error, the others fitted. A problem of the whole table
    (a missing or non-numeric column, an unknown rule) raises instead. `fit_options` go to
    `fits.power_law.fit_power_law` (bootstrap, ci_level, seed, delta, cluster...)."""
    from fits.power_law import fit_power_law  # scipy loads when a law is fitted, not when the CLI parses flags

    check_floor(floor)
    check_bootstrap(fit_options.get("bootstrap", 0))  # options of every law: the table's problem, not one law's
    check_level(fit_options.get("ci_level", 0.95))
    if group is not None and group not in df.columns:
        raise FitInputError(f"no such column; the table has {sorted(map(str, df.columns))}", column=group)
    if group is not None:
        check_group_values(df, group)
    if select == "best":  # its groupby drops a run with no x unseen: refused by line, as the other rules refuse it
        require_columns(df, [x])
        numeric_column(df, x, positive=True)
    rows, info = select_runs(df, x, y, group=group, select=select)
    require_columns(rows, [x, y])
    numeric_column(rows, x, positive=True)
    numeric_column(rows, y, positive=True)
    check_distinct_runs(rows, group, fit_options.get("id_column", "run_id"))
    parts = [(y, rows)] if group is None else [(str(k), p) for k, p in rows.groupby(group, sort=True)]
    laws, errors = {}, {}
    for name, part in parts:
        try:
            laws[name] = fit_power_law(part, x, y, group=None if group is None else name, floor=floor, **fit_options)
        except FitError as err:
            errors[name] = err
    info["n_points"] = {name: int(len(part)) for name, part in parts}
    info["floor"] = {"rule": floor, "description": FLOOR_RULES[floor]}
    return PowerLawSet(names=tuple(name for name, _ in parts), laws=laws, errors=errors, rows=rows, group=group, x=x, y=y, selection=info)
