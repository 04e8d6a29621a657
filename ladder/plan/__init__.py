"""Planning: what a ladder is, before anything runs. Pure arithmetic over a recipe (no torch, Ray or
MLflow; an import-linter contract holds it): the recipe and its YAML input, the rung generator,
exact parameter and FLOP counts, source scaling, the compute plan and train-config resolution.

The names a notebook or script usually needs are re-exported here (`from ladder.plan import
plan_ladder, load_recipe`); each lives in its own module below."""

from ladder.plan.compute import ComputePlan, plan_compute
from ladder.plan.generator import RungSpec, plan_ladder, plan_rung
from ladder.plan.recipe import Recipe, available_recipes, load_recipe

__all__ = ["ComputePlan", "Recipe", "RungSpec", "available_recipes", "load_recipe", "plan_compute", "plan_ladder",
           "plan_rung"]
