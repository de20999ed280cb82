"""manifests/examples/model-inference ships the model its spec describes: the ConfigMap's
``classifier.fnm`` is byte for byte what ``python -m flexnpu_wire.modeltool write`` makes of
``classifier.json`` (the README's recipe), so editing one without the other fails here. That the
Pod's program runs it on a share and prints the README's output is
``tests/e2e/test_example_programs.py``."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import yaml

from flexnpu_wire import modelfile, modeltool

FOLDER = Path(__file__).resolve().parents[2] / "manifests" / "examples" / "model-inference"


def test_the_configmap_holds_the_model_of_the_spec() -> None:
    docs = [d for d in yaml.safe_load_all((FOLDER / "model-inference.yaml").read_text()) if d]
    (cm,) = [d for d in docs if d["kind"] == "ConfigMap"]
    shipped = base64.b64decode(cm["binaryData"]["classifier.fnm"], validate=True)
    spec = json.loads((FOLDER / "classifier.json").read_text())
    assert shipped == modelfile.render(modeltool.from_spec(spec, base=FOLDER))
    # and the Pod reads it where the ConfigMap is mounted
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    (ctr,) = pod["spec"]["containers"]
    (mount,) = ctr["volumeMounts"]
    assert f'b"{mount["mountPath"]}/classifier.fnm"' in ctr["args"][0]
