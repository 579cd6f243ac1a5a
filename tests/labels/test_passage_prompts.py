"""The prompt sources over in-group text sources (:class:`lkv.labels.passage_prompts.PassagePrompts`): their
shared settings are checked alike, and their ``describe()`` lines and prompt ids are pinned (an id's digest
covers its content), so a label folder made by an earlier version still resumes and grows."""

import pytest

from lkv.labels.multi_question_prompts import MultiQuestionPrompts
from lkv.labels.source_prompts import SourcePrompts
from lkv.labels.task_mix import TaskMixPrompts

CLASSES = (SourcePrompts, MultiQuestionPrompts, TaskMixPrompts)
NO_CODE = {"doc_qa": 1.0, "distractor": 1.0, "instruction": 1.0, "few_shot": 1.0}
OWN_SETTINGS = {
    SourcePrompts: {},
    MultiQuestionPrompts: {"questions": 3, "split": "dev"},
    TaskMixPrompts: {"task_weights": NO_CODE, "max_facts": 3, "max_shots": 2},
}
# describe() and the ids of the four prompts of `made`, as the three classes gave them before they shared a base
PINNED = {
    SourcePrompts: (
        "SourcePrompts(sources=['debian-copyright'], num_prompts=4, words=40..90, "
        "fact_formats=['serial_code', 'iso_date'], seed=3)",
        [
            "sources-s3-00000-57994cc2",
            "sources-s3-00001-820b5056",
            "sources-s3-00002-d2b051a5",
            "sources-s3-00003-c64d9ccf",
        ],
    ),
    MultiQuestionPrompts: (
        "MultiQuestionPrompts(sources=['debian-copyright'], questions=3, split=dev, num_prompts=4, "
        "words=40..90, fact_formats=['serial_code', 'iso_date'], seed=3)",
        [
            "multiq-dev-s3-k3-00000-d70dae9d",
            "multiq-dev-s3-k3-00001-ccb4791d",
            "multiq-dev-s3-k3-00002-308381d8",
            "multiq-dev-s3-k3-00003-1b5b4e2d",
        ],
    ),
    TaskMixPrompts: (
        "TaskMixPrompts(sources=['debian-copyright'], code_sources=['python-stdlib'], num_prompts=4, "
        "words=40..90, task_weights={'doc_qa': 1.0, 'distractor': 1.0, 'instruction': 1.0, 'few_shot': 1.0}, "
        "fact_formats=['serial_code', 'iso_date'], max_facts=3, max_shots=2, seed=3)",
        [
            "taskmix-s3-00000-8fb0208c",
            "taskmix-s3-00001-d3ead342",
            "taskmix-s3-00002-071a37fc",
            "taskmix-s3-00003-35fe7ca2",
        ],
    ),
}


def made(cls: type, **shared):
    """``cls`` over the copyright files of ``shared["roots"]``, every shared setting off its default (or as
    ``shared`` sets it)."""
    settings = {
        "sources": ("debian-copyright",),
        "num_prompts": 4,
        "min_words": 40,
        "max_words": 90,
        "fact_formats": ("serial_code", "iso_date"),
        "seed": 3,
    }
    return cls(**{**settings, **shared}, **OWN_SETTINGS[cls])


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_describe_and_prompt_ids_are_pinned(cls, source_roots):
    source = made(cls, roots=source_roots)
    assert (source.describe(), [p.id for p in source]) == (PINNED[cls][0], PINNED[cls][1])
    assert len(source) == 4


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    ("shared", "error"),
    [
        ({"num_prompts": -1}, r"num_prompts must be ≥ 0, got -1"),
        ({"min_words": 91}, r"need 1 ≤ min_words ≤ max_words, got min_words=91, max_words=90"),
        ({"sources": ()}, r"sources must name at least one text source"),
        ({"sources": ("perl-pod",)}, r"text source 'perl-pod' is in the held-out group"),
        ({"fact_formats": ("passphrase",)}, r"fact_formats \['passphrase'\] are evaluation-only"),
        ({"roots": {"nowhere": "/tmp"}}, r"roots: unknown text sources \['nowhere'\]"),
    ],
)
def test_every_source_checks_the_shared_settings_alike(cls, shared, error):
    with pytest.raises(ValueError, match=error):
        made(cls, **{"roots": {}, **shared})
