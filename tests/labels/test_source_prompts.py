"""Training prompts over many sources: only in-group sources, only their train documents, only train facts."""

import pytest

from lkv.labels.source_prompts import SourcePrompts
from lkv.labels.sources import HELDOUT_SOURCES, document_split


def make(roots, **kwargs) -> SourcePrompts:
    settings = {
        "sources": tuple(roots),
        "num_prompts": 30,
        "min_words": 20,
        "max_words": 60,
        "roots": roots,
    }
    return SourcePrompts(**{**settings, **kwargs})


@pytest.mark.parametrize("name", HELDOUT_SOURCES)
def test_a_training_prompt_source_refuses_every_heldout_source(name):
    with pytest.raises(
        ValueError, match=rf"'{name}' is in the held-out group.*no training prompt may use it"
    ):
        SourcePrompts(sources=("paul-graham-essays", name))


@pytest.mark.parametrize("fmt", ["measurement", "contact_name", "badge_code", "passphrase"])
def test_evaluation_only_and_heldout_kinds_are_refused(fmt):
    with pytest.raises(ValueError, match=rf"\['{fmt}'\] are evaluation-only"):
        SourcePrompts(sources=("paul-graham-essays",), fact_formats=("serial_code", fmt))


def test_prompts_come_from_train_documents_and_state_their_answer_once(source_roots):
    prompts = list(make(source_roots))
    assert len(prompts) == 30 and {p.source for p in prompts} == set(source_roots)
    for prompt in prompts:
        content = prompt.messages[0]["content"]
        assert document_split(prompt.doc_id) == "train"
        assert content.count(prompt.answer) == 1 and content.endswith("\n\n" + prompt.meta["question"])
        assert prompt.meta["evidence"] in content and prompt.meta["format"] in (
            "magic_number",
            "serial_code",
            "iso_date",
        )
        if prompt.source == "chatterbot-dialogue":
            assert f"A: {prompt.meta['evidence']}\n" in content
    longer = list(make(source_roots, num_prompts=40))
    assert [p.id for p in longer[:30]] == [p.id for p in prompts]  # a longer run extends a shorter one
    assert make(source_roots).extends(make(source_roots, num_prompts=10).describe())
