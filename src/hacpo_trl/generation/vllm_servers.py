"""Each server-mode agent's vLLM server and weight-sync port, from its settings: one server per agent.

In TRL's server mode an agent generates on its own ``trl vllm-serve`` process and pushes its weights to it over a
port of its own. Torch-free (it reads resolved settings only), so that the config and ``--plan`` check the same.
"""

from __future__ import annotations

from ..run.resolve import ResolvedAgent, ResolvedRecipe

__all__ = ["check_vllm_servers", "vllm_servers"]


def vllm_servers(recipe: ResolvedRecipe) -> dict[str, tuple[str, int]]:
    """Each server-mode agent's (server URL, weight-sync port), from its settings (`hacpo_trl.run.resolve`)."""

    def get(agent: ResolvedAgent, key: str, default=None):
        value = agent.get(key)
        return default if value is None else value

    servers = {}
    for agent in recipe.agents:
        if not get(agent, "use_vllm", False) or get(agent, "vllm_mode", "colocate") != "server":
            continue
        url = get(agent, "vllm_server_base_url")
        if url is None:
            url = f"http://{get(agent, 'vllm_server_host', '0.0.0.0')}:{get(agent, 'vllm_server_port', 8000)}"
        servers[agent.name] = (str(url).rstrip("/").lower(), int(get(agent, "vllm_group_port", 51216)))
    return servers


def check_vllm_servers(recipe: ResolvedRecipe) -> None:
    """Refuse two agents on one vLLM server (each would push its weights into the other's) or on one weight-sync
    port (both rank-0 processes would bind it: EADDRINUSE)."""
    seen: dict[tuple[int, object], str] = {}
    for name, (url, port) in vllm_servers(recipe).items():
        for what, value in ((0, url), (1, port)):
            other = seen.setdefault((what, value), name)
            if other != name:
                label = f"vLLM server {value}" if what == 0 else f"weight-sync port {value}"
                key = "vllm_server_base_url" if what == 0 else "vllm_group_port"
                raise ValueError(
                    f"agents {other!r} and {name!r} would share the {label}; give each agent its own `{key}` "
                    "(an AgentSpec field) and start one `trl vllm-serve` per agent"
                )
