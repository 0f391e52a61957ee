"""A recipe's agents, read once: each agent's entry checked, its settings over the run's, its output folder.

The ``agents`` key is a list of agent entries or a mapping name -> entry (see :class:`AgentSpec`). :func:`resolve`
checks it and gives every agent a :class:`ResolvedAgent`: the run's settings, then the agent's own `AgentSpec`
fields that are run settings too (`learning_rate`, `learn_from`, ...), then its ``overrides``; and its output folder
(its own `output_dir`, else ``<run output_dir>/<name>`` when the run has several agents). The recipe checks
(`hacpo_trl.launch.recipe`), `HACPOConfig`, the launch plan and the placement all read agents through it, so an agent's
setting means the same to each of them.

Torch-free (standard library only): the placement and the checks before any ML library loads import it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "AGENT_RUN_FIELDS",
    "DEFAULT_OUTPUT_DIR",
    "LAUNCH_ONLY",
    "NOT_PER_AGENT",
    "AgentSpec",
    "ResolvedAgent",
    "ResolvedRecipe",
    "agent_output_dir",
    "as_specs",
    "check_overrides",
    "resolve",
]

DEFAULT_OUTPUT_DIR = "hacpo_output"  # the run's folder when a run of several agents names none

# Fields an agent may not override: they define the run, not the agent (the ones an agent may set differently are
# its own `AgentSpec` fields).
NOT_PER_AGENT = frozenset(
    {"agents", "output_dir", "learning_rate", "hub_model_id", "model_init_kwargs", "chat_template_kwargs", "sharing"}
)
# One value for the whole launch; why, for the error.
LAUNCH_ONLY = {"share_gpus": "all agents share the GPUs or none do"}
# `AgentSpec` fields that are run settings as well: the agent's value (when given) replaces the run's.
AGENT_RUN_FIELDS = (
    "learning_rate",
    "learn_from",
    "hub_model_id",
    "chat_template_kwargs",
    "model_init_kwargs",
    "vllm_server_base_url",
    "vllm_group_port",
)


@dataclass
class AgentSpec:
    """One agent of a HACPO run.

    Args:
        name: unique name; used in logs, metric names and default output folders.
        model_name_or_path: Hub id or local path of the model (can be left out when the trainer is given a model).
        tokenizer_name_or_path: tokenizer to use; defaults to the model's.
        num_processes: ranks of the launch given to this agent (data-parallel inside the agent only).
        chat_template_kwargs: extra kwargs for this agent's chat template (e.g. ``{"enable_thinking": false}``).
        learning_rate: this agent's learning rate; defaults to the run's.
        learn_from: whom this agent learns from: ``"all"``, ``"none"``, or a list of agent names (YAML list or
            ``"a,b"``); defaults to the run's `learn_from`. It still shares its own rollouts with every agent.
        lora: ``peft.LoraConfig`` keyword arguments for LoRA; ``None`` means full fine-tuning.
        output_dir: where this agent's checkpoints and final model go; defaults to ``<run output_dir>/<name>``.
        hub_model_id: Hub repository of this agent (with ``push_to_hub``).
        model_init_kwargs: kwargs for ``from_pretrained`` of this agent's model (e.g. ``{"dtype": "bfloat16"}``).
        vllm_server_base_url: with ``vllm_mode: server``, this agent's own vLLM server (e.g.
            ``"http://localhost:8001"``); defaults to the run's ``vllm_server_base_url`` / host and port.
        vllm_group_port: with ``vllm_mode: server``, the port this agent's rank 0 opens for the weight-sync group
            with its server; defaults to the run's ``vllm_group_port`` (51216). Two agents may share neither a
            server nor a weight-sync port: both are refused at start-up.
        overrides: any other ``HACPOConfig`` field for this agent only (e.g. ``weight_decay``,
            ``per_device_train_batch_size``, ``capability_gate``, ``peer_fade_steps``, ``peer_filter``). Sampling
            and schedule settings must stay equal across agents.
    """

    name: str
    model_name_or_path: str | None = None
    tokenizer_name_or_path: str | None = None
    num_processes: int = 1
    chat_template_kwargs: dict | None = None
    learning_rate: float | None = None
    learn_from: str | list[str] | None = None
    lora: dict | None = None
    output_dir: str | None = None
    hub_model_id: str | None = None
    model_init_kwargs: dict | None = None
    vllm_server_base_url: str | None = None
    vllm_group_port: int | None = None
    overrides: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "/" in self.name:
            raise ValueError(f"agent `name` must be a non-empty string without '/', got {self.name!r}")
        count = self.num_processes
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"agent {self.name!r}: `num_processes` must be an integer >= 1, got {count!r}")
        if self.lora is not None and not isinstance(self.lora, dict):
            raise ValueError(f"agent {self.name!r}: `lora` must be a mapping of LoraConfig arguments or null")
        if not isinstance(self.overrides, Mapping):
            raise ValueError(
                f"agent {self.name!r}: `overrides` must be a mapping of HACPOConfig fields, got {self.overrides!r}"
            )


def agent_output_dir(spec: AgentSpec, run_output_dir: str | None, several: bool) -> str | None:
    """Where an agent saves: its own `output_dir`, else `<run output_dir>/<name>` when the run has several agents."""
    if spec.output_dir:
        return spec.output_dir
    if several:
        return os.path.join(run_output_dir or DEFAULT_OUTPUT_DIR, spec.name)
    return run_output_dir


def _refuse_launch_settings(entry: Mapping, name: Any) -> None:
    overrides = entry.get("overrides")
    for key, why in LAUNCH_ONLY.items():
        if key in entry or (isinstance(overrides, Mapping) and key in overrides):
            raise ValueError(
                f"`{key}` is a setting of the whole launch ({why}): set it at the top of the recipe, not for one "
                f"agent (agent {name!r})"
            )


def as_specs(agents: Any) -> list[AgentSpec]:
    """The agents key (a list of entries or `AgentSpec`, a mapping name -> entry, or either as a JSON string from
    the command line) as `AgentSpec`, checked: known keys, unique names, no two explicit output folders alike."""
    if isinstance(agents, str):
        agents = json.loads(agents)
    if isinstance(agents, Mapping):
        items = []
        for name, spec in agents.items():
            if spec is not None and not isinstance(spec, Mapping | AgentSpec):
                raise ValueError(f"agent {name!r} must be a mapping of settings, got {spec!r}")
            spec = dataclasses.asdict(spec) if isinstance(spec, AgentSpec) else dict(spec or {})
            if spec.setdefault("name", name) != name:
                raise ValueError(f"agent {name!r} has a different `name` inside: {spec['name']!r}")
            items.append(spec)
        agents = items
    if not isinstance(agents, list | tuple) or not agents:
        raise ValueError("`agents` must be a non-empty list (or mapping name -> settings) of agents")
    specs = []
    valid = {f.name for f in dataclasses.fields(AgentSpec)}
    for item in agents:
        if isinstance(item, AgentSpec):
            _refuse_launch_settings(item.overrides, item.name)
            specs.append(item)
            continue
        if not isinstance(item, Mapping):
            raise ValueError(f"each agent must be a mapping of settings, got {item!r}")
        _refuse_launch_settings(item, item.get("name"))
        unknown = sorted(set(item) - valid)
        if unknown:
            raise ValueError(f"agent {item.get('name')!r}: unknown key(s) {unknown}; valid keys: {sorted(valid)}")
        specs.append(AgentSpec(**item))
    names = [s.name for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"agent name(s) used more than once: {duplicates}")
    outputs = [os.path.abspath(s.output_dir) for s in specs if s.output_dir]
    if len(outputs) != len(set(outputs)):
        raise ValueError("two agents share an `output_dir`; give each agent its own (or leave it unset)")
    return specs


def _own_settings(spec: AgentSpec, fields: Collection[str] | None) -> dict[str, Any]:
    """What the agent sets over the run: its run-level fields that are given, then its overrides, checked."""
    own = {key: getattr(spec, key) for key in AGENT_RUN_FIELDS if getattr(spec, key) is not None}
    for key, value in spec.overrides.items():
        if key == "sharing":
            raise ValueError(
                f"agent {spec.name!r}: `sharing` names the run's mode; override its settings instead "
                "(e.g. peer_prompts, taught_scale)"
            )
        if key in NOT_PER_AGENT:
            raise ValueError(f"agent {spec.name!r}: cannot override {key!r} (set it on the agent itself)")
        if not isinstance(key, str) or key.startswith("_") or (fields is not None and key not in fields):
            raise ValueError(f"agent {spec.name!r}: cannot override {key!r} (not a HACPOConfig field)")
        if key in own:
            raise ValueError(
                f"agent {spec.name!r} sets `{key}` both as its own field and in `overrides`; keep one (the field)"
            )
        own[key] = value
    return own


def check_overrides(resolved: ResolvedRecipe, fields: Collection[str]) -> None:
    """The check :func:`resolve` makes with ``fields``, on agents it resolved without them."""
    for agent in resolved.agents:
        _own_settings(agent.spec, fields)


@dataclass(frozen=True)
class ResolvedAgent:
    """One agent as the run trains it: ``settings`` is the run's settings (the recipe without ``agents``) with
    ``own_settings`` (its run-level fields, its overrides and its output folder) applied."""

    name: str
    spec: AgentSpec
    output_dir: str | None
    own_settings: Mapping[str, Any]
    settings: Mapping[str, Any]

    def get(self, key: str, default: Any = None) -> Any:
        """This agent's value of a setting (``default`` where neither the run nor the agent gives it)."""
        return self.settings.get(key, default)


@dataclass(frozen=True)
class ResolvedRecipe:
    """Every agent of a run, in launch order, and the run's own output folder (None: one agent, none named)."""

    agents: tuple[ResolvedAgent, ...]
    output_dir: str | None

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.agents]

    @property
    def process_counts(self) -> list[int]:
        return [a.spec.num_processes for a in self.agents]

    @property
    def several(self) -> bool:
        return len(self.agents) > 1

    def agent(self, name: str) -> ResolvedAgent:
        return next(a for a in self.agents if a.name == name)

    def under(self, defaults: Mapping[str, Any]) -> ResolvedRecipe:
        """These agents with ``defaults`` beneath each one's settings: what :func:`resolve` gives for
        ``{**defaults, **recipe}``, without resolving the recipe again. ``defaults`` may not name the agents or an
        output folder, which decide what the agents are."""
        if {"agents", "output_dir"} & set(defaults):
            raise ValueError("`defaults` may not set `agents` or `output_dir`: resolve the recipe with them instead")
        agents = tuple(
            dataclasses.replace(a, settings=MappingProxyType({**defaults, **a.settings})) for a in self.agents
        )
        return ResolvedRecipe(agents, self.output_dir)


def resolve(
    recipe: Mapping[str, Any], fields: Collection[str] | None = None, default: AgentSpec | None = None
) -> ResolvedRecipe:
    """The agents of ``recipe`` (a recipe mapping, or a config's values), each with its settings and output folder.

    ``fields``: the settings an agent may override (`HACPOConfig`'s fields); None skips that check where they are
    not known without importing TRL. ``default``: the agent of a recipe without ``agents`` (the config's implicit
    single agent); without one, a missing ``agents`` is an error. Raises ValueError naming the agent and the fix.
    """
    entries = recipe.get("agents")
    if entries is None:
        if default is None:
            raise ValueError("`agents` is missing: name at least one agent with its model_name_or_path")
        specs = [default]
    else:
        specs = as_specs(entries)
    several = len(specs) > 1
    run_dir = recipe.get("output_dir")
    run = {key: value for key, value in recipe.items() if key != "agents"}  # the run's settings
    agents, folders = [], {}
    for spec in specs:
        folder = agent_output_dir(spec, run_dir, several)
        where = os.path.abspath(folder or ".")
        if folders.setdefault(where, spec.name) != spec.name:
            raise ValueError(
                f"agents {folders[where]!r} and {spec.name!r} would both save to {where}; give each its own "
                "`output_dir`"
            )
        own = {**_own_settings(spec, fields), "output_dir": folder}
        settings = MappingProxyType({**run, **own})
        agents.append(ResolvedAgent(spec.name, spec, folder, MappingProxyType(own), settings))
    return ResolvedRecipe(tuple(agents), run_dir or (DEFAULT_OUTPUT_DIR if several else None))
