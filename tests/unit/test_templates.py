"""HDK templates: the table, names, instance counts and ``npu-smi info -t template-info``."""

from __future__ import annotations

import pytest

from dra_driver import templates
from dra_driver.errors import ErrorCode, InvalidInput
from dra_driver.templates import Template


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        pytest.param("vir10_3c_32g", (10, 3, 32, ""), id="a2"),
        pytest.param("vir04_3c_ndvpp", (4, 3, None, "ndvpp"), id="310p-no-media"),
        pytest.param("vir10_4c_16g_m", (10, 4, 16, "m"), id="a2-media"),
        pytest.param("vir01", (1, None, None, ""), id="310p-plain"),
    ],
)
def test_parse_name(name: str, parsed: tuple[object, ...]) -> None:
    assert templates.parse_name(name) == parsed


@pytest.mark.parametrize("name", ["vir1", "vnpu_2c", "vir10_3c_32g_x", "", "vir10;rm -rf"])
def test_parse_name_rejects(name: str) -> None:
    with pytest.raises(InvalidInput) as info:
        templates.parse_name(name)
    assert info.value.field == "template"


def test_table_per_model() -> None:
    assert [t.name for t in templates.for_model("Ascend910")] == ["vir06_1c_16g", "vir12_3c_32g"]
    b4 = {t.name: t for t in templates.for_model("910B4")}
    assert b4["vir05_1c_8g"] == Template("vir05_1c_8g", 5, 1, 8192)
    p310 = {t.name: t for t in templates.for_model("310P3")}
    assert p310["vir04"] == Template("vir04", 4, 4, 12288, 4)
    assert p310["vir02_1c"] == Template("vir02_1c", 2, 1, 6144, 2)
    assert p310["vir04_4c_dvpp"].media == 8 and p310["vir04_3c_ndvpp"].media == 0
    assert templates.for_model("no-such-chip") == ()


def test_recommended_310p_combinations_fit_exactly() -> None:
    t = {x.name: x for x in templates.for_model("310P3")}
    for combo in (("vir04", "vir04_3c"), ("vir04", "vir02", "vir02_1c")):
        assert sum(t[n].aicore for n in combo) == 8
        assert sum(t[n].aicpu for n in combo) == 7
        assert sum(t[n].media or 0 for n in combo) == 8
        assert sum(t[n].memory_mib for n in combo) == templates.template_memory_mib("310P3", 21527)


def test_instances_take_the_scarcest_resource() -> None:
    t = Template("vir10_3c_32g", 10, 3, 32768)
    assert templates.instances(t, aicore=20, aicpu=7, memory_mib=65536, media=None) == 2
    assert templates.instances(t, aicore=20, aicpu=5, memory_mib=65536, media=None) == 1
    assert templates.instances(t, aicore=20, aicpu=7, memory_mib=32767, media=None) == 0


def test_vnpu_id_ranges() -> None:
    assert templates.vnpu_id_range("910B3", 2) == range(132, 140)  # inference: +100 .. +107
    assert templates.vnpu_id_range("Ascend910", 1) == range(116, 132)  # training: +100 .. +115


TEMPLATE_INFO = """\
+------------------------------------------------------------------------------------+
| NPU instance template info is:                                                     |
| Name                AICORE    Memory    AICPU    VPC    VENC    JPEGD              |
|                               GB                                                   |
+====================================================================================+
| vir05_1c_16g        5         16        1        1      0       2                  |
| vir10_3c_32g        10        32        3        3      0       4                  |
+------------------------------------------------------------------------------------+
"""


def test_parse_template_info() -> None:
    assert templates.parse_template_info(TEMPLATE_INFO, model="910B3") == (
        Template("vir05_1c_16g", 5, 1, 16384),
        Template("vir10_3c_32g", 10, 3, 32768),
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        pytest.param("nothing useful\n", "no header", id="no-header"),
        pytest.param("| Name AICORE Memory |\n", "no template rows", id="no-rows"),
        pytest.param("| Name AICORE Memory |\n| vir05_1c_16g five 16GB |\n", "not integers", id="bad-int"),
        pytest.param("| Name AICORE Memory |\n| vir05_1c_16g 5 lots |\n", "not like 16GB", id="bad-memory"),
        pytest.param("| Name AICORE Memory |\n| vir05_1c_16g 6 16GB |\n", "do not match", id="name-mismatch"),
        pytest.param("| Name AICORE Memory |\n| vir05_1c_16g 5 |\n", "columns", id="short-row"),
    ],
)
def test_parse_template_info_rejects(text: str, words: str) -> None:
    with pytest.raises(InvalidInput, match=words) as info:
        templates.parse_template_info(text, model="910B3")
    assert info.value.code == ErrorCode.INVALID_NPU_SMI
    assert info.value.field == "template-info"
