"""Sharded PyTorch training: FSDP2 x expert parallelism applied to the unmodified model
(`distributed`), expert-parallel MoE (`expert_parallel`), distributed Muon (`dist_muon`), sharded
checkpoints (`dist_checkpoint`) and the Ray Train / torchrun launch (`launch`)."""
