"""LongBench (Bai et al., 2023): the 16 English tasks with the official prompts, truncation and metrics.

Data comes from LongBench's own JSONL files (``<data_dir>/<dataset>.jsonl``, one object per line with
``input``, ``context``, ``answers``, ``all_classes``, ``_id``, ...), or from the hub (``THUDM/LongBench``)
when ``data_dir`` is not given and the machine is online. Prompts follow ``config/dataset2prompt.json``,
answer lengths ``config/dataset2maxlen.json``; a prompt over ``max_length`` tokens keeps its first and last
``max_length / 2`` tokens (``pred.py``); the chat template is used except for the few-shot and code tasks;
scores are ``metrics.py``'s, the best over a sample's answers, after keeping only the first line for
``trec``, ``triviaqa`` and ``samsum`` (``eval.py``). The question-agnostic split puts everything up to and
including ``{context}`` in the compressed part and the rest of the template (with ``{input}``) after it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lkv.eval.tasks.base import Sample, Task
from lkv.eval.tasks.metrics import LONGBENCH_METRICS

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

LongBenchDataset = Literal[
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "gov_report",
    "qmsum",
    "multi_news",
    "trec",
    "triviaqa",
    "samsum",
    "passage_count",
    "passage_retrieval_en",
    "lcc",
    "repobench-p",
]

_QA_TAIL = (
    "Answer the question based on the given passages. Only give me the answer and do not output any other "
    "words.\n\nQuestion: {input}\nAnswer:"
)
PROMPTS: dict[str, str] = {
    "narrativeqa": (
        "You are given a story, which can be either a novel or a movie script, and a question. Answer the "
        "question asconcisely as you can, using a single phrase if possible. Do not provide any explanation."
        "\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a "
        "single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "qasper": (
        "You are given a scientific article and a question. Answer the question as concisely as you can, "
        "using a single phrase or sentence if possible. If the question cannot be answered based on the "
        'information in the article, write "unanswerable". If the question is a yes/no question, answer '
        '"yes", "no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the '
        "question based on the above article as concisely as you can, using a single phrase or sentence if "
        "possible. If the question cannot be answered based on the information in the article, write "
        '"unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not '
        "provide any explanation.\n\nQuestion: {input}\n\nAnswer:"
    ),
    "multifieldqa_en": (
        "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based "
        "on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\n"
        "Answer:"
    ),
    "hotpotqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\n" + _QA_TAIL
    ),
    "2wikimqa": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\n" + _QA_TAIL
    ),
    "musique": (
        "Answer the question based on the given passages. Only give me the answer and do not output any other "
        "words.\n\nThe following are given passages.\n{context}\n\n" + _QA_TAIL
    ),
    "gov_report": (
        "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n"
        "{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"
    ),
    "qmsum": (
        "You are given a meeting transcript and a query containing a question or instruction. Answer the query "
        "in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting "
        "transcript in one or more sentences.\n\nQuery: {input}\nAnswer:"
    ),
    "multi_news": (
        "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n"
        "Now, write a one-page summary of all the news.\n\nSummary:"
    ),
    "trec": (
        "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n"
        "{input}"
    ),
    "triviaqa": (
        "Answer the question based on the given passage. Only give me the answer and do not output any other "
        "words. The following are some examples.\n\n{context}\n\n{input}"
    ),
    "samsum": (
        "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n"
        "{input}"
    ),
    "passage_count": (
        "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please "
        "carefully read these paragraphs and determine how many unique paragraphs there are after removing "
        "duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n"
        "Please enter the final count of unique paragraphs after removing duplicates. The output format should "
        "only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: "
    ),
    "passage_retrieval_en": (
        "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the "
        "abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number "
        'of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", '
        '"Paragraph 2", etc.\n\nThe answer is: '
    ),
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
MAX_NEW_TOKENS: dict[str, int] = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "lcc": 64,
    "repobench-p": 64,
}
METRICS: dict[str, str] = {
    "narrativeqa": "qa_f1",
    "qasper": "qa_f1",
    "multifieldqa_en": "qa_f1",
    "hotpotqa": "qa_f1",
    "2wikimqa": "qa_f1",
    "musique": "qa_f1",
    "gov_report": "rouge",
    "qmsum": "rouge",
    "multi_news": "rouge",
    "trec": "classification",
    "triviaqa": "qa_f1",
    "samsum": "rouge",
    "passage_count": "count",
    "passage_retrieval_en": "retrieval",
    "lcc": "code_sim",
    "repobench-p": "code_sim",
}
# Few-shot and code tasks are fed as raw text (LongBench's pred.py skips the chat template for them).
NO_CHAT = frozenset({"trec", "triviaqa", "samsum", "lcc", "repobench-p"})
# Only the first line of the answer is scored (eval.py).
FIRST_LINE = frozenset({"trec", "triviaqa", "samsum"})
HUB_ID = "THUDM/LongBench"


def split_prompt(dataset: str) -> tuple[str, str]:
    """The template cut right after ``{context}``: ``(compressed part, question part)``."""
    template = PROMPTS[dataset]
    cut = template.index("{context}") + len("{context}")
    return template[:cut], template[cut:]


def load_records(dataset: str, data_dir: str | None) -> list[dict[str, Any]]:
    """LongBench rows of ``dataset`` from ``<data_dir>/<dataset>.jsonl``, or from the hub without a folder."""
    if data_dir is None:
        from datasets import load_dataset

        try:
            return list(load_dataset(HUB_ID, dataset, split="test"))
        except Exception as error:
            raise RuntimeError(
                f"could not load LongBench {dataset!r} from the hub ({error}); download LongBench's data.zip "
                "and pass its folder as data_dir (it holds <dataset>.jsonl files)"
            ) from error
    path = Path(data_dir) / f"{dataset}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such LongBench file (expected <data_dir>/{dataset}.jsonl)")
    records = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not valid JSON ({error})") from error
            for key, kind in (("input", str), ("context", str), ("answers", list)):
                if not isinstance(record.get(key), kind):
                    found = type(record.get(key)).__name__
                    raise ValueError(f"{path}:{number}: field {key!r} must be {kind.__name__}, found {found}")
            records.append(record)
    return records


class LongBenchTask(Task):
    """One LongBench English task.

    Args:
        dataset: LongBench task name (``hotpotqa``, ``gov_report``, ``lcc``, ...).
        data_dir: folder of LongBench's ``<dataset>.jsonl`` files; None loads from the hub (needs internet).
        max_length: prompt tokens kept (LongBench: 3500 for 4K-context models, 31500 for 32K ones).
        num_samples: use only the first this many rows (None: all).
        max_new_tokens: answer length (default: LongBench's for the task).
    """

    def __init__(
        self,
        dataset: LongBenchDataset = "hotpotqa",
        data_dir: str | None = None,
        max_length: int = 3500,
        num_samples: int | None = None,
        max_new_tokens: int | None = None,
    ) -> None:
        if dataset not in PROMPTS:
            raise ValueError(f"unknown LongBench task {dataset!r}; choose one of {', '.join(PROMPTS)}")
        if max_length <= 0:
            raise ValueError(f"max_length must be positive, got {max_length}")
        self.dataset = dataset
        self.name = f"longbench/{dataset}"
        self.metric = METRICS[dataset]
        self.data_dir = data_dir
        self.max_length = max_length
        self.num_samples = num_samples
        self.max_new_tokens = max_new_tokens or MAX_NEW_TOKENS[dataset]

    def samples(self, tokenizer: PreTrainedTokenizerBase) -> list[Sample]:
        records = load_records(self.dataset, self.data_dir)
        if self.num_samples is not None:
            records = records[: self.num_samples]
        head, tail = split_prompt(self.dataset)
        out = []
        for index, record in enumerate(records):
            question = tail.format(input=record["input"])
            context = truncate_middle(
                tokenizer, head.format(context=record["context"]), question, self.max_length
            )
            out.append(
                Sample(
                    id=f"{self.dataset}-{record.get('_id', index)}",
                    context=context,
                    question=question,
                    answers=[str(a) for a in record["answers"]],
                    max_new_tokens=self.max_new_tokens,
                    chat=self.dataset not in NO_CHAT,
                    # pred.py stops samsum at a newline as well as at EOS
                    stop=("\n",) if self.dataset == "samsum" else (),
                    meta={"all_classes": record.get("all_classes"), "length": record.get("length")},
                )
            )
        return out

    def score(self, prediction: str, sample: Sample, reference: str | None = None) -> dict[str, float]:
        if self.dataset in FIRST_LINE:
            prediction = prediction.lstrip("\n").split("\n")[0]
        metric = LONGBENCH_METRICS[self.metric]
        classes = sample.meta.get("all_classes")
        best = max(metric(prediction, answer, all_classes=classes) for answer in sample.answers)
        return {self.metric: best}


def truncate_middle(tokenizer: PreTrainedTokenizerBase, context: str, question: str, max_length: int) -> str:
    """The context part of a prompt after LongBench's middle truncation of ``context + question``.

    ``pred.py`` keeps the first and last ``max_length // 2`` tokens of the whole prompt. The question part
    sits at the end and is shorter than half the limit, so the cut comes out of the middle of the context:
    its first ``max_length // 2`` tokens and its last ``max_length // 2 − len(question)`` tokens stay.
    """
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    question_len = len(tokenizer(question, add_special_tokens=False)["input_ids"])
    if len(context_ids) + question_len <= max_length:
        return context
    half = max_length // 2
    if question_len >= half:
        raise ValueError(
            f"the question part alone ({question_len} tokens) is over half of max_length={max_length}"
        )
    tail = half - question_len
    return tokenizer.decode(context_ids[:half], skip_special_tokens=True) + tokenizer.decode(
        context_ids[len(context_ids) - tail :], skip_special_tokens=True
    )
