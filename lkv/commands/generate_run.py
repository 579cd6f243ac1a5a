"""`lkv generate`'s run (:func:`generate_answer`): the model, its press and the compressed generation. Torch and
transformers are imported here, once the options are parsed and checked, so `lkv generate --help` stays light."""

from __future__ import annotations

import sys
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lkv.commands.generate_settings import GenerateSettings
from lkv.core.chat import encode_context, encode_question
from lkv.core.context import fit_context, model_context
from lkv.core.generation import Sampling
from lkv.eviction.compressor import Compressor
from lkv.eviction.presses import Press, ProbePress
from lkv.eviction.presses.lookaheadkv import load_lookahead
from lkv.eviction.presses.restorekv import RestoreKVPress
from lkv.eviction.registry import make_method
from lkv.eviction.roles import roles_of
from lkv.model.backbone import DEFAULT_MODEL, load_backbone
from lkv.model.probe import read_probe_config
from lkv.model.restore import RestoreAdapter
from lkv.train.export import resolve_adapter, resolve_probe


def generate_answer(run: GenerateSettings) -> None:
    """Load ``run``'s model and press, compress its prompt's KV cache and print the answer to stdout (a
    summary line with the method, budget and prompt length to stderr)."""
    net, tokenizer, press = load_press(run)
    compressor = Compressor(
        net,
        tokenizer,
        press,
        run.checked_budget,
        run.selection,
        streamed=run.streamed,
        enable_thinking=run.enable_thinking,
    )
    if run.question is None:
        ids = compressor.encode(run.text)[0].tolist()
        asked = None
    else:
        ids = encode_context(tokenizer, run.text, run.enable_thinking)
        asked = encode_question(tokenizer, run.question, enable_thinking=run.enable_thinking)
    reserve = len(asked or []) + run.max_new_tokens
    ids = fit_context(ids, reserve, model_context(net), run.truncate)
    out = compressor.generate(
        ids, Sampling(run.max_new_tokens, run.temperature, run.top_p, run.seed, tuple(run.stop or ())), asked
    )
    print(out.text)
    heads = {"equal": "", "adaptive": ", adaptive head budgets"}.get(
        run.head_budget, f", threshold {'matched to the budget' if run.threshold is None else run.threshold}"
    )
    print(
        f"lkv generate [{run.method}, budget {run.checked_budget}{heads}, "
        f"{out.prompt_tokens} prompt tokens]: {out.summary()}",
        file=sys.stderr,
    )


def load_press(run: GenerateSettings) -> tuple[PreTrainedModel, PreTrainedTokenizerBase, Press]:
    """The model, its tokenizer and ``run``'s press: a lookahead module with its settings (and fused probe), a
    probe or a RestoreKV module (``--press_args '{folder: ...}'``) on its base model (``--model``, else the one its
    folder names, else the default), or a training-free
    method on ``--model`` (default: the embedded one)."""
    model, options = run.model, {"dtype": run.dtype, "attn_implementation": run.attn_implementation}
    if run.adapter is not None:
        press_probe = None if run.fused_probe is None else resolve_probe(run.fused_probe, model)
        return load_lookahead(
            resolve_adapter(run.adapter, model),
            model,
            run.dtype,
            run.attn_implementation,
            run.device,
            run.lookahead,
            press_probe,
        )
    if run.probe is not None:
        folder = resolve_probe(run.probe, model)
        base = model or read_probe_config(folder).extra.get("model") or DEFAULT_MODEL
        net, tokenizer = load_backbone(base, **options, device=run.device)
        return net, tokenizer, ProbePress.from_folder(folder, net)
    if roles_of(run.method).requires == "restore":  # a RestoreKV folder: on the model it names
        settings = {k: v for k, v in (run.press_args or {}).items() if k != "scores"}  # KVzip (checked)
        base = (
            model or RestoreAdapter.read_folder(Path(settings["folder"])).extra.get("model") or DEFAULT_MODEL
        )
        net, tokenizer = load_backbone(base, **options, device=run.device)
        return net, tokenizer, RestoreKVPress.from_folder(model=net, **settings)
    net, tokenizer = load_backbone(model or DEFAULT_MODEL, **options, device=run.device)
    return net, tokenizer, make_method(run.method, **(run.press_args or {}))
