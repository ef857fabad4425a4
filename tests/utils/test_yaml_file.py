"""The one YAML loader: a mapping back, or a ConfigError naming the file and the line."""

from __future__ import annotations

import pytest

from atroposlib.errors import ConfigError
from atroposlib.utils.yaml_file import load_yaml


def test_a_mapping_comes_back_and_an_empty_file_is_empty(tmp_path):
    (tmp_path / "ok.yaml").write_text("env:\n  group_size: 8\n")
    assert load_yaml(tmp_path / "ok.yaml") == {"env": {"group_size": 8}}
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    assert load_yaml(tmp_path / "empty.yaml") == {}


def test_bad_yaml_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("env:\n  group_size: 8\n  lr: [1, 2\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    message = str(info.value)
    assert message.startswith(f"{path}:4:1: not valid YAML: ")
    assert "(while parsing a flow sequence that starts at line 3, column 7)" in message
    assert "\n" not in message


def test_tabs_are_reported_where_they_stand(tmp_path):
    path = tmp_path / "tabs.yaml"
    path.write_text("env:\n\tgroup_size: 8\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2:1: not valid YAML: found character '\\t'"):
        load_yaml(path)


def test_missing_file_and_non_mapping_top_level(tmp_path):
    with pytest.raises(ConfigError, match=r"^--config .*nope.yaml does not exist"):
        load_yaml(tmp_path / "nope.yaml", "--config")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping.*got a list"):
        load_yaml(tmp_path / "list.yaml")


def test_no_python_objects_are_built(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("x: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_yaml(path)
