"""The built-in agents and models, offline: `builtin:<name>` resolved to a folder (`builtin`), the tiny agents of the
CPU demo and benchmarks built from a seed and warm-started (`tiny`, `demo`), real pretrained models shipped in
packages (`pretrained`), the paper's model shapes for systems checks (`shapes`), and where they are cached or
committed (`cache`). May import `tasks` and `evaluation` (a warm-start is evaluated as training evaluates).
"""
