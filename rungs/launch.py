"""`python -m rungs.launch` and `rungs.launch.launch_ray` / `train_sharded`: the sharded job's entry
points, kept at their old import path; the code lives in `rungs.parallel.launch`."""

from __future__ import annotations

from rungs.parallel.launch import launch_ray, main, train_sharded

__all__ = ["launch_ray", "main", "train_sharded"]

if __name__ == "__main__":
    raise SystemExit(main())
