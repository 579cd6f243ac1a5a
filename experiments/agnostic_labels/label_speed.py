"""Question-agnostic labels of 4-question contexts: one prefill per question (label_prompt per question) against
one shared prefill of the context (label_questions), side by side in one process, with the answers and scores
compared.

    OMP_NUM_THREADS=1 PYTHONPATH=$PWD python experiments/agnostic_labels/label_speed.py
"""

import time

import torch

from lkv.core.generation import eos_ids
from lkv.labels.labeller import label_prompt, label_questions, reduce_questions, split_questions
from lkv.labels.multi_question_prompts import MultiQuestionPrompts
from lkv.model.backbone import load_backbone

torch.set_num_threads(1)
model, tok = load_backbone("smollm2-135m")
prompts = MultiQuestionPrompts(num_prompts=2)
eos = eos_ids(model, tok)
for prompt in list(prompts)[:2]:
    context, asked = split_questions(tok, prompt.meta["context"], prompt.meta["questions"], 7680, "middle")
    start = time.perf_counter()
    alone = [label_prompt(model, context, 128, eos, True, q) for q in asked]
    old = time.perf_counter() - start
    start = time.perf_counter()
    new = label_questions(model, context, asked, 128, eos, "max")
    shared = time.perf_counter() - start
    want = reduce_questions([a.scores for a in alone], "max")
    same = new.response_ids == [t for a in alone for t in a.response_ids]
    print(
        f"{len(context)} context tokens, {len(asked)} questions: {old:.1f} s -> {shared:.1f} s "
        f"({old / shared:.2f}x); responses equal: {same}; max |score diff| {(new.scores - want).abs().max():.2e}"
    )
