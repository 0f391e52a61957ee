"""An agent evaluated on its own, as the standalone model it is at inference (`evaluate`): generation with
transformers or vLLM sized to the free memory, scoring with the run's rewards, the paper's benchmarks; the training
run's before and after numbers and `hacpo-eval` (`hacpo_trl.launch.evaluate`) both use it. May import `tasks` and
`planning`.
"""
