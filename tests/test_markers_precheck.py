"""check_markers_before_recording (engramprof/analysis/batches.py): a markers file is refused before any
probe attaches when its complete lines hold no usable marker; an unfinished last line (one the
server may be writing) is not held against it.  No root."""
from __future__ import annotations

import json

import pytest

from engramprof.analysis import batches
from engramprof.errors import UserError

GOOD = json.dumps({"start_ns": 1, "end_ns": 2})


@pytest.mark.parametrize("text", ["", "\n\n", GOOD + "\n", GOOD + "\nnot json\n", '{"start_ns": 1', "  \n",
                                  GOOD + "\n{\"start_ns\""])
def test_usable_or_still_being_written_passes(tmp_path, text):
    p = tmp_path / "m.jsonl"
    p.write_text(text)
    batches.check_markers_before_recording(p)


@pytest.mark.parametrize("text", ["not json\n", "x\ny\n", "x\n" + '{"start_ns": 1', "x\n  \n", '{"a": 1}\n'])
def test_complete_garbage_is_refused(tmp_path, text):
    p = tmp_path / "m.jsonl"
    p.write_text(text)
    with pytest.raises(UserError, match="no usable marker"):
        batches.check_markers_before_recording(p)


def test_a_complete_line_longer_than_a_mebibyte_is_judged_by_its_end(tmp_path):
    """The end of the file is what tells a finished line, however long the file (the check
    read only its first MiB: a garbage line past it looked unfinished and passed)."""
    p = tmp_path / "m.jsonl"
    p.write_text("x" * (1 << 21) + "\n")
    with pytest.raises(UserError, match="no usable marker"):
        batches.check_markers_before_recording(p)
    p.write_text("x" * (1 << 21))  # unfinished: passes
    batches.check_markers_before_recording(p)


def test_ending_is_of_what_was_parsed(tmp_path):
    p = tmp_path / "m.jsonl"
    p.write_text(GOOD + "\n" + GOOD)
    df, bad, complete = batches.read_markers_and_ending(p)
    assert (len(df), bad, complete) == (2, 0, False)
    p.write_text(GOOD + "\n")
    assert batches.read_markers_and_ending(p)[2] is True
    assert batches.read_markers(p)[1] == 0 and len(batches.read_markers(p)[0]) == 1


def test_missing_and_directory_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match="no such markers file"):
        batches.check_markers_before_recording(tmp_path / "none.jsonl")
    with pytest.raises(UserError, match="is a directory"):
        batches.check_markers_before_recording(tmp_path)
