"""read_json_file: every way a user's JSON file can be wrong is one line."""

import pytest

from laxflow.errors import UserError, read_json_file


def test_reads_json(tmp_path):
    f = tmp_path / "ok.json"
    f.write_text('{"a": [1, 2]}')
    assert read_json_file(f, "input") == {"a": [1, 2]}


@pytest.mark.parametrize(
    "content, message",
    [
        (b"{not json", "in.json: input: not valid JSON (Expecting property name enclosed in double quotes at line 1 column 2)"),
        (b"\xff\xfe", "in.json: input: not UTF-8 text (byte 0)"),
    ],
)
def test_bad_content_is_one_line_naming_the_file(tmp_path, content, message):
    f = tmp_path / "in.json"
    f.write_bytes(content)
    with pytest.raises(UserError) as info:
        read_json_file(f, "input")
    assert str(info.value) == str(tmp_path / message)


def test_missing_file(tmp_path):
    with pytest.raises(UserError, match=r"missing.json: input: cannot read \(No such file or directory\)"):
        read_json_file(tmp_path / "missing.json", "input")
