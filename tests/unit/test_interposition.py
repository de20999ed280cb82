"""The CDI edits that inject libascendcl.so into a share's containers (dra_driver/interposition.py)."""

from __future__ import annotations

import json

import pytest

from dra_driver import cdi, interposition, sharing
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.interposition import Interposition as I  # noqa: N817
from flexnpu_testing import clibrary

UID = "0d7e4b2c-1111-2222-3333-444455556666"
LIB = "/opt/flexnpu/lib/libascendcl.so"
RO = ("ro", "nosuid", "nodev", "rbind")
PRELOAD_EDITS = cdi.Edits(
    env=("FLEXNPU_INTERPOSITION=preload",),
    mounts=(
        cdi.Mount(LIB, "/usr/lib/flexnpu/libascendcl.so", RO),
        *(
            cdi.Mount(f"/opt/flexnpu/lib/{n}", f"/usr/lib/flexnpu/{n}", RO)
            for n in interposition.CLOSURE_LIBRARIES
        ),
        cdi.Mount("/opt/flexnpu/lib/ld.so.preload", "/etc/ld.so.preload", RO),
    ),
)


@pytest.mark.parametrize(
    ("mode", "installed", "want_mode", "want_edits"),
    [
        pytest.param(I.AUTO, True, I.PRELOAD, PRELOAD_EDITS, id="auto-installed"),
        pytest.param(I.AUTO, False, I.NONE, cdi.Edits(), id="auto-not-installed"),
        pytest.param(I.PRELOAD, True, I.PRELOAD, PRELOAD_EDITS, id="preload"),
        pytest.param(I.NONE, True, I.NONE, cdi.Edits(), id="none-installed"),
        pytest.param(I.NONE, False, I.NONE, cdi.Edits(), id="none-not-installed"),
    ],
)
def test_plan(mode: I, installed: bool, want_mode: I, want_edits: cdi.Edits) -> None:
    lib = interposition.client_library(LIB, is_file=lambda p: installed)
    got = interposition.plan(mode, lib, claim_uid=UID)
    assert (got.mode, got.edits) == (want_mode, want_edits)


def test_preload_without_the_library_names_the_claim_and_field() -> None:
    lib = interposition.client_library(LIB, is_file=lambda p: False)
    with pytest.raises(InvalidInput) as err:
        interposition.plan(I.PRELOAD, lib, claim_uid=UID)
    assert err.value.code == ErrorCode.INVALID_OPAQUE_CONFIG
    assert err.value.field == "interposition" and err.value.claim_uid == UID
    assert LIB in str(err.value) and "ld.so.preload" in str(err.value)


@pytest.mark.parametrize(
    ("modes", "want"),
    [
        pytest.param([], I.AUTO, id="no-shares"),
        pytest.param([I.NONE], I.NONE, id="one"),
        pytest.param([I.PRELOAD, I.PRELOAD], I.PRELOAD, id="agree"),
    ],
)
def test_resolve_mode(modes: list[I], want: I) -> None:
    assert interposition.resolve_mode(modes, claim_uid=UID) == want


def test_shares_that_disagree_are_refused() -> None:
    with pytest.raises(InvalidInput) as err:
        interposition.resolve_mode([I.AUTO, I.NONE], claim_uid=UID)
    assert err.value.field == "interposition" and "auto, none" in str(err.value)


def test_a_spec_with_the_edits_is_valid_and_stays_at_cdi_0_5() -> None:
    edits = interposition.plan(
        I.PRELOAD, interposition.client_library(LIB, is_file=lambda p: True), claim_uid=UID
    ).edits
    spec = cdi.Spec(kind=cdi.Kind.parse("flexnpu.io/vnpu"), devices=(cdi.CDIDevice(f"{UID}-vnpu-0", edits),))
    cdi.validate(spec, claim_uid=UID)
    assert cdi.required_version(spec) == "0.5.0"


def test_both_files_must_exist() -> None:
    only_lib = interposition.client_library(LIB, is_file=lambda p: p == LIB)
    assert not only_lib.installed
    assert interposition.plan(I.AUTO, only_lib, claim_uid=UID).mode == I.NONE


def test_opaque_config_field_decodes_and_rejects_unknown_values() -> None:
    hdr = {"apiVersion": sharing.API_VERSION, "kind": sharing.KIND}
    cfg = sharing.resolve([("claim[0]", {**hdr, "interposition": "none"})], claim_uid=UID)
    assert cfg.interposition == I.NONE
    assert sharing.resolve([], claim_uid=UID).interposition == I.AUTO
    with pytest.raises(InvalidInput) as err:
        sharing.resolve([("claim[0]", {**hdr, "interposition": "ld-path"})], claim_uid=UID)
    assert err.value.field == "claim[0].interposition" and "auto, preload, none" in str(err.value)


def test_every_library_of_the_closure_must_exist() -> None:
    missing = f"/opt/flexnpu/lib/{interposition.CLOSURE_LIBRARIES[-1]}"
    lib = interposition.client_library(LIB, is_file=lambda p: p != missing)
    assert not lib.installed
    with pytest.raises(InvalidInput, match="closure"):
        interposition.plan(I.PRELOAD, lib, claim_uid=UID)


def test_the_closure_is_the_built_one_and_the_preload_list_names_it_all() -> None:
    """The constant is libascendcl/api/closure.json's list; make's preload list names each library
    at its container path, libascendcl.so first."""
    table = json.loads((clibrary.LIBRARY_DIR / "api" / "closure.json").read_text())
    assert tuple(lib["soname"] for lib in table["libraries"]) == interposition.CLOSURE_LIBRARIES
    built = clibrary.build_library()
    preload = (built.parent / interposition.PRELOAD_LIST_NAME).read_text().split()
    assert preload == [interposition.CONTAINER_LIBRARY] + [
        f"/usr/lib/flexnpu/{n}" for n in interposition.CLOSURE_LIBRARIES
    ]
    for name in interposition.CLOSURE_LIBRARIES:
        assert (built.parent / name).is_file(), name
