"""`lkv eval` warns in one line when a lookahead module runs in a prompt setting it was not trained for."""

import json

import pytest

import lkv.commands.eval
import lkv.eviction.presses.lookaheadkv
from lkv.model.lookahead import CONFIG_FILE, LookaheadAdapter
from tests.conftest import build_tiny_model, tiny_needle_task


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """A tiny-Llama adapter folder exported before modules recorded their setting (so: aware)."""
    monkeypatch.setattr(lkv.eviction.presses.lookaheadkv, "load_backbone", lambda *a, **k: build_tiny_model())
    module = LookaheadAdapter.create(build_tiny_model("llama")[0], num_tokens=4)
    module.save(tmp_path / "adapter")
    return tmp_path / "adapter"


def warnings(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if "warning:" in line]


def evaluate(folder, corpus, output, settings) -> None:
    lkv.commands.eval.evaluate(
        [tiny_needle_task(corpus)],
        methods=("lookaheadkv",),
        budgets=(16,),
        settings=settings,
        adapter=str(folder),
        output=str(output),
        progress=False,
    )


def test_a_module_in_the_other_setting_gets_one_warning_line(folder, tiny_corpus, tmp_path, capsys):
    evaluate(folder, tiny_corpus, tmp_path / "aware", ("aware",))
    assert warnings(capsys) == []
    evaluate(folder, tiny_corpus, tmp_path / "both", ("aware", "agnostic"))
    assert warnings(capsys) == [
        f"lkv eval: warning: lookaheadkv's module {folder} was trained for the aware setting "
        "(lookahead.json extra.setting) and runs here in the agnostic setting too"
    ]
    config = folder / CONFIG_FILE
    config.write_text(json.dumps({**json.loads(config.read_text()), "extra": {"setting": "agnostic"}}))
    evaluate(folder, tiny_corpus, tmp_path / "agnostic", ("agnostic",))
    assert warnings(capsys) == []
    evaluate(folder, tiny_corpus, tmp_path / "aware_again", ("aware",))
    (line,) = warnings(capsys)
    assert line.endswith(
        f"{folder} was trained for the agnostic setting (lookahead.json extra.setting) and runs here in the aware setting too"
    )


def test_a_ranked_task_runs_its_labels_own_prompt_so_only_aware_counts():
    """The importance and needle-token tasks score each prompt with its question whatever `settings` says: a
    run that asks for both settings runs them only aware, and an aware module there gets no warning."""
    from lkv.eval.tasks import ImportanceTask, settings_run

    ranked = ImportanceTask("labels")
    assert settings_run([ranked], ("aware", "agnostic")) == ["aware"]
    assert settings_run([ranked, tiny_needle_task("corpus")], ("agnostic", "aware")) == ["aware", "agnostic"]
    assert settings_run([tiny_needle_task("corpus")], ("agnostic",)) == ["agnostic"]
