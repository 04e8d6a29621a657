"""The report's published LR/WD laws (a recipe's `hparam_laws`) evaluated at a rung, and the check every
LR/WD law's values pass (fitted ones in `fits.extrapolate` too). Imports nothing heavy: planning a rung
(`ladder.plan.generator`) calls it, and `ladder plan` loads no fitting stack.
"""

from __future__ import annotations

import math
from typing import Any

from fits.errors import FitInputError

# |log| of an LR, LR·WD or WD the laws may give: e^±100 is far past any usable value, and well inside a float.
MAX_LOG_HPARAM = 100.0


def usable_lr_wd(log_lr: float, log_product: float, *, where: str) -> None:
    """LR and LR·WD that laws give must be finite positive numbers (a hand-edited or extreme law can give
    e^1000): refused naming the point, never an OverflowError deep in a card."""
    if not (math.isfinite(log_lr) and math.isfinite(log_product) and abs(log_lr) < MAX_LOG_HPARAM
            and abs(log_product) < MAX_LOG_HPARAM and abs(log_product - log_lr) < MAX_LOG_HPARAM):
        raise FitInputError(f"the LR/WD laws give log LR* = {log_lr:.4g} and log LR*·WD* = {log_product:.4g} {where}: "
                            "not a learning rate and weight decay a run can use; check the laws")


def hparams_from_report(laws: dict[str, float], *, steps: float, tpp: float, source: str) -> dict[str, Any]:
    """The report's published laws (the recipe's `hparam_laws`): point values only, no intervals."""
    log_lr = laws["log_lr_intercept"] + laws["log_lr_log_tpp"] * math.log(tpp) + laws["log_lr_log_steps"] * math.log(steps)
    log_prod = math.log(laws["lr_wd_product_coef"]) + laws["lr_wd_product_steps_exponent"] * math.log(steps)
    usable_lr_wd(log_lr, log_prod, where=f"at {steps:.4g} steps, TPP {tpp:g}")
    lr = math.exp(log_lr)  # the values themselves as the report's laws are written (plans and trial keys use them)
    prod = laws["lr_wd_product_coef"] * steps ** laws["lr_wd_product_steps_exponent"]
    return {"lr": {"value": lr, "interval95": None, "law": "log LR* = a + b·log TPP + c·log steps"},
            "lr_wd_product": {"value": prod, "interval95": None, "law": "LR*·WD* = coef·steps^k"},
            "wd": {"value": prod / lr, "law": "LR*·WD* / LR*"},
            "source": f"{source} (published laws from the recipe, NOT fitted by this ladder)"}
