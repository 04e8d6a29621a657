"""The JAX engine of a rung: the same model as `rungs.model`, as pure functions over plain pytrees.

Parameters are a flat `dict[str, jax.Array]` keyed by the PyTorch state-dict names, in the same
layouts (`rungs.jaxjob.params`), so `ladder.plan.counting.parameter_shapes`, optimizer roles and
checkpoint conversion hold by identity. No module library: a dict of arrays and functions of it
is all jit, grad and (later, from outside) sharding need. The folder is not named `jax` so that it
never shadows the library.
"""
