"""The vLLM integration: each agent's engine seeds (`vllm_seed`), TRL's colocated engine on vLLM's CPU build
(`vllm_cpu`), each server-mode agent's server and weight-sync port (`vllm_servers`), and the trainer's one call before
and one after TRL builds the engine (`engine`). May import `run`. Torch-free at import: `vllm_servers` (the config
and the plan check the servers alike).
"""
