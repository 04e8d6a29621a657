"""`ladder demo`: the whole flow on embedded defaults.

Until the training stack lands this runs the planning flow: `ladder plan` on both shipped recipes.
"""

from __future__ import annotations

import argparse

from ladder.cli_plan import plan_payload, render_plan
from ladder.plan import plan_ladder
from ladder.recipe import load_recipe


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the demo flow on embedded defaults")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    for name, rungs, gpus in (("cpu-demo", None, None), ("mai-base-2", [18, 24, 30, 36, 42, 102], 16000)):
        recipe = load_recipe(name)
        ns = argparse.Namespace(gpus=gpus, mfu=None, goodput=None)
        render_plan(plan_payload(recipe, plan_ladder(recipe, rungs), ns))
    return 0
