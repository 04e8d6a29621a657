"""The one training loop is framework-free, and the PyTorch engines implement its protocol."""

from __future__ import annotations

import subprocess
import sys

from tests.rungs.train_helpers import REPO

_BLOCK = """
import sys
class _Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "jax", "ray"):
            raise ImportError(f"the loop imported {name}")
sys.meta_path.insert(0, _Refuse())
import rungs.loop, rungs.engine
print("ok")
"""


def test_the_loop_and_the_engine_protocol_import_no_framework():
    out = subprocess.run([sys.executable, "-c", _BLOCK], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_both_pytorch_engines_implement_the_engine_protocol():
    from rungs.engine import Engine
    from rungs.parallel.engine import ShardedTorchEngine
    from rungs.torch_engine import TorchEngine

    wanted = {name for name in dir(Engine) if not name.startswith("_")} | {"rank", "world"}
    for engine in (TorchEngine, ShardedTorchEngine):
        assert not {n for n in wanted if n not in ("rank", "world") and not callable(getattr(engine, n, None))}
    from rungs.config import parse_config
    from tests.rungs.train_helpers import tiny_config

    assert isinstance(TorchEngine(parse_config(tiny_config())), Engine)


def test_train_runs_a_jax_backend_config_on_the_jax_engine_under_the_same_loop(tmp_path):
    import json

    from rungs.train import train
    from tests.rungs.train_helpers import tiny_config

    res = train(tiny_config(max_steps=2, backend="jax", precision="fp32"), run_dir=tmp_path, progress=False)
    assert res.steps == 2 and set(res.bpb) and res.unigram_bpb
    stored = json.loads((tmp_path / "result.json").read_text())
    assert stored["losses"] == res.losses and (tmp_path / "data_report.json").is_file()
    assert not (tmp_path / "checkpoint.pt").exists()  # the JAX engine's checkpoint, not the torch one
