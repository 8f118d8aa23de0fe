"""The Python package against the CLI: each function returns exactly what the command's --json
writes, raises InputError with exactly the line the command prints, and reads models as the CLI
does (names, files, folders) plus config dicts and objects with to_dict().

Run by ctest (python_api) with PYTHONPATH at the build's python/ folder and TRAINPLAN_BINARY set
to the `trainplan` binary of the same build."""
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest

import trainplan

SOURCE = Path(os.environ.get("TRAINPLAN_SOURCE_DIR", Path(__file__).resolve().parents[2]))
BINARY = os.environ.get("TRAINPLAN_BINARY", str(SOURCE / "build" / "trainplan"))
HF = SOURCE / "tests" / "data" / "hf"


def cli(command, args, tmp_path):
    """`trainplan COMMAND ARGS --json FILE`: (exit status, stderr, the document or None)."""
    out = tmp_path / f"cli-{command}.json"
    if out.exists():
        out.unlink()
    r = subprocess.run([BINARY, command, *args, "--json", str(out)], capture_output=True, text=True)
    return r.returncode, r.stderr, json.loads(out.read_text()) if out.exists() else None


def steady(doc):
    """The document without its wall-clock figures (elapsed_s), which differ between any two runs."""
    if isinstance(doc, dict):
        return {k: steady(v) for k, v in doc.items() if k != "elapsed_s"}
    if isinstance(doc, list):
        return [steady(v) for v in doc]
    return doc


# (Python keyword arguments, the same plan as CLI flags)
PLANS = [
    (dict(model="llama3-8b", cluster="dgx-h100", gpus=8, global_batch=64, tp=2),
     "--model llama3-8b --cluster dgx-h100 --gpus 8 --global-batch 64 --tp 2"),
    (dict(model="llama3-70b", cluster="dgx-h100", gpus=64, global_batch=512, tp=8, pp=4, vp=2, zero=1,
          recompute="selective", sequence_parallel=True),
     "--model llama3-70b --cluster dgx-h100 --gpus 64 --global-batch 512 --tp 8 --pp 4 --vp 2 --zero 1 "
     "--recompute selective --sequence-parallel on"),
    (dict(model="gpt2-xl", cluster="dgx-a100-80g", gpus=4, global_batch=32, zero=2, dtype="fp16",
          software="pytorch-eager", engine="des"),
     "--model gpt2-xl --cluster dgx-a100-80g --gpus 4 --global-batch 32 --zero 2 --dtype fp16 "
     "--software pytorch-eager --engine des"),
    (dict(model="gpt3-175b", cluster="dgx-a100-80g", gpus=8, global_batch=8, tp=8),  # infeasible: exit 3
     "--model gpt3-175b --cluster dgx-a100-80g --gpus 8 --global-batch 8 --tp 8"),
    (dict(model="qwen3-30b-a3b", cluster="dgx-b200", gpus=8, global_batch=64, ep=8, cuda_graphs="full",
          recompute_modules="moe_act,layernorm"),
     "--model qwen3-30b-a3b --cluster dgx-b200 --gpus 8 --global-batch 64 --ep 8 --cuda-graphs full "
     "--recompute-modules moe_act,layernorm"),
    (dict(model="qwen3-30b-a3b", cluster="dgx-h100", gpus=8, global_batch=64, ep=8,
          cuda_graph_modules="attn,moe_router,moe_preprocess"),
     "--model qwen3-30b-a3b --cluster dgx-h100 --gpus 8 --global-batch 64 --ep 8 "
     "--cuda-graph-modules attn,moe_router,moe_preprocess"),
]


@pytest.mark.parametrize("kwargs,flags", PLANS)
def test_predict_is_the_cli_json(kwargs, flags, tmp_path):
    code, _, expected = cli("predict", flags.split(), tmp_path)
    assert code in (0, 3) and expected is not None
    assert trainplan.predict(**kwargs) == expected


def test_an_infeasible_plan_is_returned_with_its_reasons():
    doc = trainplan.predict(**PLANS[3][0])
    assert doc["feasible"] is False and doc["infeasible_reasons"]


@pytest.mark.parametrize("kwargs,flags", PLANS[:2])
def test_simulate_is_the_cli_json(kwargs, flags, tmp_path):
    code, _, expected = cli("simulate", flags.split(), tmp_path)
    assert code in (0, 3) and expected is not None
    assert trainplan.simulate(**kwargs) == expected


def test_search_with_lists_and_switches_is_the_cli_json(tmp_path):
    # zero=[1, 2] is --zero 1,2; exact_gpus=True the switch --exact-gpus; refine=False is --refine off.
    code, _, expected = cli("search", "--model llama3-8b --cluster dgx-h100 --gpus 16 --global-batch 128 "
                                      "--zero 1,2 --exact-gpus --refine off --threads 1".split(), tmp_path)
    assert code == 0
    got = trainplan.search(model="llama3-8b", cluster="dgx-h100", gpus=16, global_batch=128, zero=[1, 2],
                           exact_gpus=True, refine=False, threads=1)
    assert steady(got) == steady(expected)
    assert all(p["strategy"]["dp"] * p["strategy"]["tp"] * p["strategy"]["pp"] * p["strategy"]["cp"] == 16
               for p in got["top"])


def test_capacity_is_the_cli_json(tmp_path):
    code, _, expected = cli("capacity", "--model llama3-8b --tokens 1T --clusters dgx-h100,dgx-a100-80g "
                                        "--threads 1".split(), tmp_path)
    assert code == 0
    got = trainplan.capacity(model="llama3-8b", tokens="1T", clusters=["dgx-h100", "dgx-a100-80g"], threads=1)
    assert steady(got) == steady(expected)


@pytest.mark.parametrize("gpus", [8, 6])
def test_bad_input_raises_the_cli_line(gpus, tmp_path):
    # tp 3 on llama3-8b: 8 GPUs are not a multiple of 3; on 6, 3 does not divide the 32 heads.
    code, err, doc = cli("predict", f"--model llama3-8b --cluster dgx-h100 --gpus {gpus} --global-batch 64 "
                                    "--tp 3".split(), tmp_path)
    assert code == 2 and doc is None and err.count("\n") == 1
    with pytest.raises(trainplan.InputError) as e:
        trainplan.predict(model="llama3-8b", cluster="dgx-h100", gpus=gpus, global_batch=64, tp=3)
    assert str(e.value) == err.rstrip("\n")
    assert isinstance(e.value, ValueError)


def test_unknown_and_refused_flags_are_input_errors():
    with pytest.raises(trainplan.InputError, match=r"^trainplan predict: .*--no-such-flag"):
        trainplan.predict(model="gpt2", cluster="dgx-h100", gpus=1, global_batch=8, no_such_flag=1)
    with pytest.raises(trainplan.InputError, match=r"^trainplan predict: --json: not taken here"):
        trainplan.predict(model="gpt2", cluster="dgx-h100", gpus=1, global_batch=8, json="x.json")
    with pytest.raises(trainplan.InputError, match=r"^trainplan predict: --global-batch: required"):
        trainplan.predict(model="gpt2", cluster="dgx-h100", gpus=1)


def unnamed(doc):
    """A prediction with its model's name blanked: at the top and in the model_spec it carries."""
    out = {**doc, "model": ""}
    if "model_spec" in out:
        out["model_spec"] = {**out["model_spec"], "name": ""}
    return out


def hf_llama3():
    return json.loads((HF / "llama3-8b" / "config.json").read_text())


def test_hf_config_dict_is_the_cli_on_its_file(tmp_path):
    flags = "--cluster dgx-h100 --gpus 8 --global-batch 64 --tp 2".split()
    code, err, expected = cli("predict", ["--model", str(HF / "llama3-8b")] + flags, tmp_path)
    assert code in (0, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = trainplan.predict(model=hf_llama3(), cluster="dgx-h100", gpus=8, global_batch=64, tp=2)
    # The same plan; an unnamed dict is named by its model_type, as the CLI names an unnamed file.
    assert got["model"] == "llama" and expected["model"] == "llama3-8b"
    assert unnamed(got) == unnamed(expected)
    assert got["strategy"]["seq_len"] == 8192
    # The CLI's note on the training length, as a warning with the same text.
    assert [str(w.message) for w in caught if w.category is trainplan.Note] == err.splitlines()


def test_named_dict_folder_and_path_give_one_plan():
    cfg = hf_llama3()
    cfg["_name_or_path"] = "meta-llama/Meta-Llama-3-8B"
    plan = dict(cluster="dgx-h100", gpus=8, global_batch=64, tp=2, seq=4096)
    by_dict = trainplan.predict(model=cfg, **plan)
    assert by_dict["model"] == "meta-llama/Meta-Llama-3-8B"
    by_folder = trainplan.predict(model=HF / "llama3-8b", **plan)       # a pathlib.Path folder
    by_file = trainplan.predict(model=str(HF / "llama3-8b" / "config.json"), **plan)
    assert by_folder == by_file
    assert unnamed(by_dict) == unnamed(by_folder)


def test_an_object_with_to_dict_is_read_as_its_dict():
    class Config:  # what a transformers PretrainedConfig offers
        def to_dict(self):
            return hf_llama3()

    plan = dict(cluster="dgx-h100", gpus=8, global_batch=64, tp=2, seq=2048)
    assert trainplan.predict(model=Config(), **plan) == trainplan.predict(model=hf_llama3(), **plan)


def test_a_transformers_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(**{k: v for k, v in hf_llama3().items() if k not in ("architectures",)})
    plan = dict(cluster="dgx-h100", gpus=8, global_batch=64, tp=2, seq=2048)
    got = trainplan.predict(model=cfg, **plan)
    assert {**got, "model": ""} == {**trainplan.predict(model=hf_llama3(), **plan), "model": ""}


def test_a_bad_dict_names_the_dict_and_its_key():
    cfg = hf_llama3()
    cfg["num_attention_heads"] = 30
    with pytest.raises(trainplan.InputError) as e:
        trainplan.predict(model=cfg, cluster="dgx-h100", gpus=8, global_batch=64)
    assert str(e.value).startswith("trainplan predict: model=<dict>: num_attention_heads = 30, must divide")
    assert "trainplan-py-" not in str(e.value)  # no temporary path the caller never saw


def test_help_is_the_cli_help():
    r = subprocess.run([BINARY, "search", "--help"], capture_output=True, text=True)
    assert r.returncode == 0
    assert trainplan.help("search") == r.stdout


@pytest.mark.parametrize("command", ["predict", "simulate", "search", "capacity"])
def test_switch_table_is_the_clis(command):
    # A switch is listed in --help as "  --name" followed by its description, with no value.
    import re
    switches = set(re.findall(r"(?m)^\s+--([a-z0-9-]+)(?: {2,}|$)", trainplan.help(command)))
    assert switches == trainplan._SWITCHES.get(command, set())


def test_builtin_data_is_found():
    data = Path(trainplan.data_dir())
    for folder in ("models", "topologies", "software", "reliability"):
        assert (data / folder).is_dir(), folder


def test_the_sweep_example_in_the_docs_runs():
    doc = (SOURCE / "docs" / "python.md").read_text()
    script = SOURCE / "docs" / "sweep_example.py"
    assert "```python\n" + script.read_text() + "```" in doc  # the page shows the file as it is
    r = subprocess.run([os.sys.executable, str(script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = r.stdout.splitlines()[1:]
    assert len(rows) == 12  # 4 tp sizes x 3 ZeRO stages
    assert all(row.split()[-1] in ("True", "False") for row in rows)
