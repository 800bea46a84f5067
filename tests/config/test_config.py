"""Config files: formats, _base_ inheritance, merge, _delete_, overrides, dumps, errors with file and line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trainwright.config import Config, ConfigDict, ConfigError, merge, parse_overrides, parse_value


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_py_config_keeps_module_variables_only(tmp_path: Path) -> None:
    cfg = Config.fromfile(
        write(
            tmp_path / "c.py",
            """
        from __future__ import annotations
        import math
        from collections import OrderedDict
        _helper = 3
        def f(): return 1
        class K: pass
        lr = 0.1 * _helper
        model = dict(type="M", depth=int(math.sqrt(16)))
    """,
        )
    )
    assert set(cfg) == {"lr", "model"}
    assert cfg.model.depth == 4 and cfg["model"]["type"] == "M" and cfg.lr == pytest.approx(0.3)
    assert isinstance(cfg.model, ConfigDict)
    with pytest.raises(AttributeError, match="did you mean 'model'|Did you mean 'model'"):
        _ = cfg.modle
    cfg.model.depth = 8
    cfg.new = dict(a=1)
    assert cfg["model"]["depth"] == 8 and cfg.new.a == 1


def test_yaml_and_json(tmp_path: Path) -> None:
    y = Config.fromfile(write(tmp_path / "c.yaml", "model:\n  type: M\n  depth: 2\nlr: 0.01\nflags: [1, 2]\n"))
    j = Config.fromfile(
        write(tmp_path / "c.json", json.dumps({"model": {"type": "M", "depth": 2}, "lr": 0.01, "flags": [1, 2]}))
    )
    assert y.to_dict() == j.to_dict() == {"model": {"type": "M", "depth": 2}, "lr": 0.01, "flags": [1, 2]}
    assert Config.fromfile(write(tmp_path / "e.yml", "")).to_dict() == {}


def test_base_inheritance_merge_and_delete(tmp_path: Path) -> None:
    write(
        tmp_path / "_base_/model.py",
        """
        model = dict(type="Net", backbone=dict(type="ResNet", depth=50, norm=dict(type="BN")), head=dict(num_classes=1000))
    """,
    )
    write(
        tmp_path / "_base_/schedule.yaml",
        """
        optim_wrapper:
          optimizer: {type: SGD, lr: 0.1, momentum: 0.9}
        train_cfg: {by_epoch: true, max_epochs: 100}
        param_scheduler: [{type: LinearLR}, {type: CosineAnnealingLR}]
    """,
    )
    write(
        tmp_path / "_base_/runtime.json",
        json.dumps({"default_hooks": {"checkpoint": {"interval": 1}}, "work_dir": "base"}),
    )
    child = write(
        tmp_path / "configs/child.py",
        """
        _base_ = ["../_base_/model.py", "../_base_/schedule.yaml", "../_base_/runtime.json"]
        model = dict(backbone=dict(depth=18, norm=dict(_delete_=True, type="GN", groups=8)), head=dict(num_classes=10))
        optim_wrapper = dict(optimizer=dict(_delete_=True, type="AdamW", lr=1e-3))
        param_scheduler = [dict(type="StepLR")]
        work_dir = "child"
    """,
    )
    cfg = Config.fromfile(child)
    assert cfg.model.to_dict() == {
        "type": "Net",
        "backbone": {"type": "ResNet", "depth": 18, "norm": {"type": "GN", "groups": 8}},
        "head": {"num_classes": 10},
    }
    assert cfg.optim_wrapper.to_dict() == {"optimizer": {"type": "AdamW", "lr": 1e-3}}  # replaced, no momentum left
    assert cfg.param_scheduler == [{"type": "StepLR"}]  # lists replace
    assert cfg.train_cfg.max_epochs == 100 and cfg.default_hooks.checkpoint.interval == 1
    assert cfg.work_dir == "child" and "_base_" not in cfg
    assert cfg.filename == str(child)


def test_single_base_string_and_chain(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "x = dict(a=1, b=dict(c=2))\n")
    write(tmp_path / "b.py", "_base_ = 'a.py'\nx = dict(b=dict(d=3))\n")
    cfg = Config.fromfile(write(tmp_path / "c.yaml", "_base_: b.py\nx: {a: 5}\n"))
    assert cfg.x.to_dict() == {"a": 5, "b": {"c": 2, "d": 3}}


def test_merge_function() -> None:
    base = {"a": {"b": 1, "c": [1]}, "d": 1}
    assert merge(base, {"a": {"c": [2]}, "e": 2}) == {"a": {"b": 1, "c": [2]}, "d": 1, "e": 2}
    assert merge(base, {"a": {"_delete_": True, "z": 0}}) == {"a": {"z": 0}, "d": 1}
    assert base == {"a": {"b": 1, "c": [1]}, "d": 1}  # not modified


def test_base_errors(tmp_path: Path) -> None:
    write(tmp_path / "a.py", "_base_ = 'b.py'\n")
    write(tmp_path / "b.py", "_base_ = 'a.py'\n")
    with pytest.raises(ConfigError, match="_base_ cycle"):
        Config.fromfile(tmp_path / "a.py")
    write(tmp_path / "c.py", "_base_ = 'missing.py'\n")
    with pytest.raises(ConfigError, match="Config file not found.*missing.py"):
        Config.fromfile(tmp_path / "c.py")
    write(tmp_path / "d1.py", "k = 1\n")
    write(tmp_path / "d2.py", "k = 2\n")
    write(tmp_path / "d.py", "_base_ = ['d1.py', 'd2.py']\n")
    with pytest.raises(ConfigError, match=r"\['k'\] are set by more than one _base_"):
        Config.fromfile(tmp_path / "d.py")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1", 1),
        ("-2.5", -2.5),
        ("1e-3", 1e-3),
        ("True", True),
        ("false", False),
        ("None", None),
        ("null", None),
        ("[1,2]", [1, 2]),
        ("(1, 2)", (1, 2)),
        ("[a,b]", ["a", "b"]),
        ("a,b", ["a", "b"]),
        ("1,2", (1, 2)),
        ("'x y'", "x y"),
        ("SGD", "SGD"),
        ("{'a': 1}", {"a": 1}),
        ("[[1,2],[3]]", [[1, 2], [3]]),
    ],
)
def test_parse_value(text: str, value: object) -> None:
    assert parse_value(text) == value


def test_overrides(tmp_path: Path) -> None:
    cfg = Config(
        dict(
            optim_wrapper=dict(optimizer=dict(type="SGD", lr=0.1)),
            param_scheduler=[dict(type="A", end=5), dict(type="B")],
        )
    )
    cfg.merge_from_args(
        [
            "optim_wrapper.optimizer.lr=0.01",
            "param_scheduler.1.end=7",
            "train_cfg.max_iters=10",
            "model.widths=[8,16]",
            "resume=True",
        ]
    )
    assert cfg.optim_wrapper.optimizer.to_dict() == {"type": "SGD", "lr": 0.01}
    assert cfg.param_scheduler[1].end == 7 and cfg.param_scheduler[0].end == 5
    assert cfg.train_cfg.max_iters == 10 and cfg.model.widths == [8, 16] and cfg.resume is True
    with pytest.raises(ConfigError, match=r"'a\.b' has no value: write KEY=VALUE"):
        parse_overrides(["a.b"])
    with pytest.raises(ConfigError, match="empty"):
        parse_overrides(["a..b=1"])
    with pytest.raises(ConfigError, match="list of 2 items"):
        cfg.merge_from_args(["param_scheduler.5.end=1"])
    with pytest.raises(ConfigError, match="not a dict or list"):
        cfg.merge_from_args(["resume.x=1"])


@pytest.mark.parametrize("suffix", [".py", ".json", ".yaml"])
def test_dump_round_trip(tmp_path: Path, suffix: str) -> None:
    write(tmp_path / "base.py", "model = dict(type='M', layers=[dict(w=1), dict(w=2)], shape=(3, 4))\nlr = 0.1\n")
    cfg = Config.fromfile(
        write(tmp_path / "c.py", "_base_ = 'base.py'\nlr = 0.01\nname = 'run'\nflag = None\nok = True\n")
    )
    cfg.merge_from_args(["model.layers.0.w=5"])
    out = cfg.dump(tmp_path / f"dumped{suffix}")
    again = Config.fromfile(out)
    expected = cfg.to_dict()
    if suffix != ".py":  # JSON and YAML have no tuples
        expected["model"]["shape"] = [3, 4]
    assert again.to_dict() == expected
    with pytest.raises(ConfigError, match="unknown suffix"):
        cfg.dump(tmp_path / "x.toml")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("suffix", [".py", ".json"])
def test_dump_of_a_config_that_defines_its_model_trains_in_a_new_process(
    tmp_path: Path, suffix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dump names the files that define classes in custom_imports: `trainwright train dump` builds the same
    model; a moved file is named."""
    import os
    import subprocess
    import sys

    net, data = f"DumpNet{suffix[1:]}", f"DumpData{suffix[1:]}"  # registered once per process: a name per case
    write(
        tmp_path / "src" / "net_cfg.py",
        f"""
        import torch
        from torch import nn
        import trainwright as tw
        from trainwright.registry import MODELS

        @MODELS.register()
        class {net}(tw.BaseModel):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 1)

            def forward(self, x, y=None, mode="tensor"):
                out = self.fc(x)
                return {{"loss": ((out - y) ** 2).mean()}} if mode == "loss" else out

        g = torch.Generator().manual_seed(0)
        model = dict(type="{net}")
        train_dataloader = dict(dataset=torch.utils.data.TensorDataset(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g)), batch_size=8)
        optim_wrapper = dict(optimizer=dict(type="SGD", lr=0.1))
        train_cfg = dict(by_epoch=True, max_epochs=1)
    """,
    )
    write(tmp_path / "src" / "child.py", "_base_ = 'net_cfg.py'\noptim_wrapper = dict(optimizer=dict(lr=0.05))\n")
    cfg = Config.fromfile(tmp_path / "src" / "child.py")
    cfg.train_dataloader = dict(
        dataset=dict(type="TensorDataset"), batch_size=8
    )  # the dump cannot hold a Dataset object: a registered one
    cfg.merge_from_dict({"train_dataloader.dataset": dict(type=data)})
    write(
        tmp_path / "src" / f"extra_{suffix[1:]}.py",
        f"""
        import torch
        from trainwright.registry import DATASETS

        @DATASETS.register()
        class {data}(torch.utils.data.TensorDataset):
            def __init__(self):
                g = torch.Generator().manual_seed(0)
                super().__init__(torch.randn(16, 4, generator=g), torch.randn(16, 1, generator=g))
    """,
    )
    cfg.custom_imports = dict(
        imports=[f"extra_{suffix[1:]}"]
    )  # a module next to the config: kept, and the defining file added
    out = cfg.dump(tmp_path / "dumped" / f"cfg{suffix}")
    again = Config.fromfile(out, import_custom_modules=False)
    assert again.custom_imports["imports"] == [f"extra_{suffix[1:]}", str((tmp_path / "src" / "net_cfg.py").resolve())]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "src"), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run(
        [sys.executable, "-m", "trainwright", "train", str(out), "--work-dir", str(tmp_path / "w")],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (tmp_path / "w" / "checkpoints" / "epoch_1.pth").is_file()
    (tmp_path / "src" / "net_cfg.py").rename(tmp_path / "src" / "moved.py")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    with pytest.raises(ConfigError, match="custom_imports: no file .*net_cfg.py.*moved or deleted"):
        Config.fromfile(out)


def test_dump_adds_the_defining_file_and_keeps_the_other_custom_imports_settings(tmp_path: Path) -> None:
    cfg = Config.fromfile(
        write(
            tmp_path / "c.py",
            """
        def scale(x):
            return 2 * x
        custom_imports = dict(imports=["json"], allow_failed_imports=True)
        lr = scale(0.05)
    """,
        )
    )
    again = Config.fromfile(cfg.dump(tmp_path / "out" / "c.py"))
    assert again.custom_imports == {
        "imports": ["json", str((tmp_path / "c.py").resolve())],
        "allow_failed_imports": True,
    }
    assert again.lr == pytest.approx(0.1)


def test_dump_writes_objects_as_strings(tmp_path: Path) -> None:
    import torch

    cfg = Config(dict(model=dict(type=torch.nn.Linear, in_features=2), path=tmp_path))
    text = cfg.dump(tmp_path / "c.py").read_text()
    assert "'torch.nn.modules.linear.Linear'" in text and str(tmp_path) in text


def test_errors_name_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Config file not found: '.*nope.py'"):
        Config.fromfile(tmp_path / "nope.py")
    with pytest.raises(ConfigError, match=r"syntax\.py:3: syntax error"):
        Config.fromfile(write(tmp_path / "syntax.py", "a = 1\nb = 2\nc = dict(x=1\n"))
    with pytest.raises(ConfigError, match=r"run\.py:2: running the config failed: NameError"):
        Config.fromfile(write(tmp_path / "run.py", "a = 1\nb = undefined_name\n"))
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: invalid YAML"):
        Config.fromfile(write(tmp_path / "bad.yaml", "a: 1\nb: c: d\n"))
    with pytest.raises(ConfigError, match=r"bad\.json:2: invalid JSON"):
        Config.fromfile(write(tmp_path / "bad.json", '{"a": 1,\n "b": }\n'))
    with pytest.raises(ConfigError, match="Unknown config format '.toml'"):
        Config.fromfile(write(tmp_path / "c.toml", "a = 1\n"))
    with pytest.raises(ConfigError, match="top level"):
        Config.fromfile(write(tmp_path / "list.yaml", "- 1\n- 2\n"))


def test_custom_imports(tmp_path: Path) -> None:
    write(
        tmp_path / "my_components_xyz.py",
        """
        from trainwright.registry import MODELS
        @MODELS.register()
        class ImportedNetXyz:
            pass
    """,
    )
    Config.fromfile(
        write(
            tmp_path / "c.py",
            "custom_imports = dict(imports=['my_components_xyz'])\nmodel = dict(type='ImportedNetXyz')\n",
        )
    )
    from trainwright.registry import MODELS

    assert "ImportedNetXyz" in MODELS
    with pytest.raises(ConfigError, match="custom_imports: cannot import 'not_a_module_xyz'"):
        Config.fromfile(write(tmp_path / "d.py", "custom_imports = dict(imports=['not_a_module_xyz'])\n"))
    Config.fromfile(
        write(tmp_path / "e.py", "custom_imports = dict(imports=['not_a_module_xyz'], allow_failed_imports=True)\n")
    )


def test_copy_and_pickle() -> None:
    import copy
    import pickle

    cfg = Config(dict(a=dict(b=[dict(c=1)])), filename="x.py")
    for other in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg)), cfg.copy()):
        assert other == cfg and other.filename == "x.py" and isinstance(other.a.b[0], ConfigDict)
        other.a.b[0].c = 2
        assert cfg.a.b[0].c == 1


@pytest.mark.parametrize("text", ["[1,2", "(1, 2", "[a,b", "[1,2)", "a,[b"])
def test_parse_value_unbalanced_brackets(text: str) -> None:
    with pytest.raises(ConfigError, match="unbalanced brackets"):
        parse_value(text)
    with pytest.raises(ConfigError, match="unbalanced brackets"):
        parse_overrides([f"a={text}"])


def test_parse_value_quoted_bracket_is_a_string() -> None:
    assert parse_value("'x ]'") == "x ]"


def test_fromstring_refuses_unknown_formats() -> None:
    with pytest.raises(ConfigError, match=r"unknown config format '.toml'"):
        Config.fromstring("a = 1", ".toml")
    with pytest.raises(ConfigError, match=r"unknown config format 'py'"):
        Config.fromstring("a = 1", "py")


def test_fromstring() -> None:
    assert Config.fromstring("a = dict(b=1)\n_x = 2\n", ".py").to_dict() == {"a": {"b": 1}}
    assert Config.fromstring("a: {b: 1, _delete_: true}\n", ".yaml").to_dict() == {"a": {"b": 1}}
    assert Config.fromstring('{"a": [1, 2]}', ".json").a == [1, 2]


# ----------------------------------------------------------------------------- mmengine's substitutions, text, diff,
# DictAction


def test_predefined_and_environment_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TEST_ROOT", "/data/set")
    monkeypatch.delenv("TW_TEST_MISSING", raising=False)
    path = tmp_path / "cfgs" / "exp_a.py"
    path.parent.mkdir()
    path.write_text(
        "work_dir = '{{ fileDirname }}/work/{{ fileBasenameNoExtension }}'\n"
        "names = ['{{ fileBasename }}', '{{ fileExtname }}']\n"
        "data_root = '{{$TW_TEST_ROOT:/default}}'\n"
        "other = '{{$TW_TEST_MISSING:/default/root}}'\n"
    )
    cfg = Config.fromfile(path)
    assert cfg.work_dir == f"{path.parent}/work/exp_a"
    assert cfg.names == ["exp_a.py", ".py"]
    assert cfg.data_root == "/data/set" and cfg.other == "/default/root"


def test_base_references_take_any_value_of_the_bases(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("model = dict(type='Net', depth=3)\nsizes = [8, 16]\nlr = 0.1\n")
    (tmp_path / "child.py").write_text(
        "_base_ = ['base.py']\n"
        "teacher = {{_base_.model}}\n"
        "width = {{ _base_.sizes.1 }}\n"
        "optim = dict(lr={{_base_.lr}}, sizes={{_base_.sizes}})\n"
    )
    cfg = Config.fromfile(tmp_path / "child.py")
    assert cfg.teacher.to_dict() == {"type": "Net", "depth": 3} and cfg.width == 16
    assert cfg.optim.to_dict() == {"lr": 0.1, "sizes": [8, 16]}
    (tmp_path / "bad.py").write_text("_base_ = ['base.py']\nx = {{_base_.modle}}\n")
    with pytest.raises(ConfigError, match=r"_base_.modle.*refers to 'modle'"):
        Config.fromfile(tmp_path / "bad.py")


def test_text_holds_the_file_and_its_bases(tmp_path: Path) -> None:
    (tmp_path / "base.py").write_text("a = 1\n")
    (tmp_path / "child.py").write_text("_base_ = 'base.py'\nb = 2\n")
    text = Config.fromfile(tmp_path / "child.py").text
    assert text.index("a = 1") < text.index("b = 2") and str(tmp_path / "base.py") in text
    assert Config(dict(a=1)).text == ""


def test_diff_is_a_unified_diff_of_the_pretty_texts() -> None:
    a, b = Config(dict(lr=0.1, model=dict(depth=3))), Config(dict(lr=0.2, model=dict(depth=3)))
    diff = Config.diff(a, b)
    changed = [line for line in diff.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-lr = 0.1", "+lr = 0.2"]
    assert Config.diff(a, a) == ""


def test_merge_from_dict_allow_list_keys() -> None:
    cfg = Config(dict(layers=[dict(w=1), dict(w=2)]))
    cfg.merge_from_dict({"layers.1.w": 5})
    assert cfg.layers[1].w == 5
    with pytest.raises(ConfigError, match="allow_list_keys=True"):
        cfg.merge_from_dict({"layers.0.w": 7}, allow_list_keys=False)


def test_dict_action_parses_and_merges_key_value_pairs() -> None:
    import argparse

    from trainwright.config import DictAction

    parser = argparse.ArgumentParser()
    parser.add_argument("--cfg-options", nargs="+", action=DictAction)
    args = parser.parse_args(["--cfg-options", "a.b=1", "c=[1,2]", "--cfg-options", "d=x", "a.b=2"])
    assert args.cfg_options == {"a.b": 2, "c": [1, 2], "d": "x"}
    with pytest.raises(SystemExit):
        parser.parse_args(["--cfg-options", "noequals"])
