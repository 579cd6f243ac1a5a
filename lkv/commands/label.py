"""`lkv label`: each prompt's greedy response and its ground-truth importance, as parquet label shards.

The prompts run through a Lightning predict loop (:class:`lkv.labels.predict.LabelingModule`), so any
strategy and launcher labels on many devices, each rank writing its own shards; a rerun skips finished
prompts.

The signature's types are light; torch, Lightning and the labeller are imported once the options parsed,
so `lkv label --help` and an option error answer at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from lkv.commands.label_settings import LabelSettings
from lkv.labels.builtin_prompts import BuiltinPrompts
from lkv.labels.dataset_prompts import HFDatasetPrompts, JsonlPrompts
from lkv.labels.multi_question_prompts import MultiQuestionPrompts
from lkv.labels.prompts import PromptSource
from lkv.labels.task_mix import TaskMixPrompts
from lkv.model.assets import DEFAULT_MODEL

# The sources `--prompts` names by class name (jsonargparse looks among the PromptSource subclasses that
# are imported); any other subclass is named by its import path, e.g. `--prompts my_package.MyPrompts`.
PROMPT_SOURCES: tuple[type[PromptSource], ...] = (
    BuiltinPrompts,
    TaskMixPrompts,
    JsonlPrompts,
    HFDatasetPrompts,
    MultiQuestionPrompts,
)


def label(
    output: str,
    prompts: PromptSource,
    model: str = DEFAULT_MODEL,
    response_tokens: int = 64,
    max_prompt_tokens: int = 2048,
    truncation: Literal["middle", "left", "skip", "error"] = "middle",
    store_scores: bool = True,
    score_dtype: Literal["float16", "float32"] | None = None,
    shard_size: int = 32,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    batch_size: int = 1,
    responses: str | None = None,
    enable_thinking: bool = False,
    accelerator: str = "auto",
    devices: int | str = 1,
    num_nodes: int = 1,
    strategy: str = "auto",
    progress: bool = True,
    label_mode: Literal["aware", "agnostic"] = "aware",
    gold_answers: bool = False,
    question_reduction: Literal["max", "mean"] = "max",
) -> str:
    """Generate each prompt's greedy response and its ground-truth importance, as parquet label shards.

    Args:
        output: label folder (created; a rerun resumes it and skips finished prompts).
        prompts: prompt source, e.g. ``{class_path: BuiltinPrompts, init_args: {split: train, num_prompts: 96}}``.
        model: embedded short name (``smollm2-135m``), local folder, ``.gguf`` file or hub id.
        response_tokens: R, the longest response generated per prompt (paper: 512).
        max_prompt_tokens: prompts longer than this follow ``truncation``.
        truncation: ``middle`` (LongBench-style: keep both ends), ``left`` (keep the end), ``skip``, ``error``.
        store_scores: False stores responses only; training then computes the ground truth online.
        score_dtype: on-disk dtype of the scores; None: ``float32`` for a new folder, the folder's own when
            resuming one. ``float16`` halves the size but loses the ranking of long prompts' small scores
            (below its smallest normal 6.1e-5 ≈ 1/16384; table in docs/scale_out.md): use it only for
            prompts of a few thousand tokens.
        shard_size: samples per shard; an interrupted run redoes at most this many per rank.
        dtype: model weights dtype (``float32`` on CPU, ``bfloat16`` on GPU).
        attn_implementation: ``sdpa`` (default) or ``eager`` (``flex_attention`` is refused).
        batch_size: prompts decoded together; batches hold prompts of similar length (sorted by text length,
            the longest first) and the share of padding is printed. The labels equal batch 1's (see
            docs/performance.md for the speed-up); 1 keeps the prompts in their source order.
        responses: a JSONL file of responses generated elsewhere (``{"id", "response"|"response_ids"}`` per
            line, e.g. by vLLM or TGI; see :mod:`lkv.labels.responses`): no generation, only the teacher-forced
            ground truth. Every prompt needs a response; the meta records the file and its SHA-256.
        enable_thinking: passed to the chat template. Off by default: Qwen3's template then renders an empty
            ``<think></think>`` block, so the R response tokens are the answer rather than reasoning text
            (templates without the variable ignore it). Recorded in ``meta.json``
            (``extra.chat_template_kwargs``); a rerun must use the same value.
        accelerator, devices, num_nodes, strategy: Lightning Trainer settings (e.g. 8 GPUs: devices=8, strategy=ddp).
        progress: show a progress bar.
        label_mode: ``aware`` (the paper): the module sees the whole prompt and the target is the response's
            attention. ``agnostic``: the module sees only the context (the prompt without its trailing
            question) and the target is the attention that the question *and* the response pay to the context
            — a module for question-agnostic compression. Needs prompts that name their question
            (``BuiltinPrompts`` records it in ``meta["question"]``; others are skipped) or their questions
            (``MultiQuestionPrompts``: a context asked k questions, each labelled alone and reduced by
            ``question_reduction``) and stored scores; prompts are labelled one at a time and responses are
            generated here. ``meta.json`` records it as ``extra.setting`` (``lkv fit`` carries it into the
            module, ``lkv export`` into ``lookahead.json``).
        gold_answers: where a prompt carries its expected answer (``BuiltinPrompts``' find_value facts,
            ``TaskMixPrompts``' asked facts, a JSONL ``answer``) and the generated response misses it,
            teacher-force the sentence that states the answer (a JSONL ``evidence``; else the answer itself) in
            its place, so the labels are the attention of a right answer (:mod:`lkv.labels.gold`). A small
            labeller answers far facts wrong; experiments/reach/README.md, section 12 measures the effect. Not
            where truncation cut the answer from the prompt. Aware labels generated here only; recorded in
            ``meta.json``.
        question_reduction: agnostic labels of a context asked several questions: ``max`` (the union, the
            multi-question Oracle's rule: a token any question needs counts fully, rows renormalised) or
            ``mean`` (the average); recorded in ``meta.json`` (``extra.question_reduction``).
    """
    run = LabelSettings(**locals())  # every option, checked before anything heavy is imported
    from lkv.commands.label_predict import predict
    from lkv.core.chat import template_kwargs
    from lkv.core.progress import counted
    from lkv.labels.lock import label_folder_lock
    from lkv.labels.predict import label_setting, run_meta
    from lkv.labels.responses import ResponsesFile
    from lkv.labels.shards import META_FILE, finished_ids, read_meta, shard_files

    folder = Path(output)
    with label_folder_lock(folder):
        if score_dtype is None:
            score_dtype = read_meta(folder).score_dtype if (folder / META_FILE).exists() else "float32"
        engine = None if responses is None else ResponsesFile(responses)
        _check_resumable(
            folder,
            response_tokens=response_tokens,
            max_prompt_tokens=max_prompt_tokens,
            truncation=truncation,
            score_dtype=score_dtype,
            store_scores=store_scores,
            setting=label_setting(label_mode, question_reduction),
            extra=run_meta(engine, gold_answers),
            chat_template_kwargs=template_kwargs(enable_thinking),
        )
        done = finished_ids(folder) if folder.exists() else set()
        todo = [p for p in run.all_prompts if p.id not in done]
        if todo:  # nothing to add: a finished folder resumes whatever its source's description (a moved file)
            _check_source(folder, prompts)
        if engine is not None:
            engine.check_covers(p.id for p in todo)
            engine.keep_only(p.id for p in todo)
        if done and not todo:
            # Nothing left to label, so no shard writer will compare the model with the folder's: do it here.
            _check_labelled_by(folder, model, dtype, attn_implementation)
        print(
            f"lkv label: {counted(len(run.all_prompts), 'prompt')}, {len(done)} already labelled, {len(todo)} to go → {folder}"
        )
        if todo:
            predict(run, todo, folder, score_dtype, engine)
        return (
            f"{counted(len(finished_ids(folder)), 'labelled prompt')} in "
            f"{counted(len(shard_files(folder)), 'shard')} at {folder}"
        )


def _check_resumable(output: Path, **settings: Any) -> None:
    """Fail before loading any model when ``output`` holds a run with other settings."""
    from lkv.labels.shards import META_FILE, REDUCTION_KEY, SETTING_KEY, canonical_extra, read_meta

    if not (output / META_FILE).exists():
        return
    meta = read_meta(output)
    extra = canonical_extra(meta.extra)
    for key, value in settings.items():
        if key == "setting":  # the setting and, for agnostic labels, the question reduction
            found = {k: extra[k] for k in (SETTING_KEY, REDUCTION_KEY) if k in extra}
        elif key == "chat_template_kwargs":
            found = extra.get(key)
        elif key == "extra":
            found = {
                k: v
                for k, v in extra.items()
                if k not in (SETTING_KEY, REDUCTION_KEY, "chat_template_kwargs")
            }
        else:
            found = getattr(meta, key)
        if found != value:
            raise ValueError(
                f"{output} already holds labels with {key}={found!r}, this run asks for {value!r}; "
                "use another --output or delete it"
            )


def _check_source(output: Path, prompts: PromptSource) -> None:
    """Fail before loading any model when ``output`` holds labels of other prompts; when they are the first
    prompts of ``prompts`` (a larger ``num_prompts``), record the larger source so the rest is added."""
    from lkv.labels.shards import META_FILE, grow_prompt_source, read_meta

    if not (output / META_FILE).exists():
        return
    previous, wanted = read_meta(output).prompt_source, prompts.describe()
    if previous == wanted:
        return
    if not prompts.extends(previous):
        raise ValueError(
            f"{output} already holds labels of the prompts {previous}; this run asks for {wanted}. Only a "
            f"larger {prompts.count_setting or 'prompt count'} of the same source adds to a folder; use another "
            "--output or delete it"
        )
    # every process of a multi-GPU run writes the same text; the rank keeps their temporary files apart
    grow_prompt_source(output, wanted, int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0))))
    print(f"lkv label: growing {output} from {previous} to {wanted}")


def _check_labelled_by(folder: Path, model: str, dtype: str, attn_implementation: str) -> None:
    """Fail unless ``folder``'s labels were made by ``model`` (loaded only when named differently)."""
    from lkv.labels.shards import read_meta
    from lkv.model.backbone import ModelSignature, check_compatible, load_backbone, model_signature

    expected = read_meta(folder).model
    if expected.get("name") == model:
        return
    backbone, tokenizer = load_backbone(model, dtype=dtype, attn_implementation=attn_implementation)
    check_compatible(
        ModelSignature.from_dict(expected),
        model_signature(backbone, tokenizer, model),
        f"label folder {folder}",
    )
