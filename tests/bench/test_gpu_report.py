"""bench/gpu_report.py: the capacity rows of a part stopped at its budget (bounds from
the probes that ended), and the markdown of a result."""

import pytest

from bench import budget, capacity, gpu_report

SPEC = capacity.ROWS
CFG = dict(capacity.SIZES["gpu_quick"])


def _Outcome(lines):
    return budget.Outcome(lines, 100.0, "stopped at its time budget after 100 s", True)


def test_rows_of_a_search_stopped_at_its_budget():
    est = dict(stages=8, micro_batches=4, remat="always", params_m=40 * 12.6)
    lines = [
        {"kind": "estimate", "row": "naive, 1 device", "layers": 2, "params_m": 25.2},
        {"kind": "estimate", "row": "pipeline K=8", "layers": 40, **est},
        {"kind": "row", "row": "naive, 1 device", "stages": 1, "layers": 2, "params_m": 25.2},
        {"kind": "probe", "row": "pipeline K=8", "layers": 40, "fits": False},
        {"kind": "probe", "row": "pipeline K=8", "layers": 37, "fits": False},
        {"kind": "probe", "row": "pipeline K=8", "layers": 33, "fits": True, "peak_mib": 2000.0},
        {"kind": "probe", "row": "pipeline K=8", "layers": 35, "error": ["Aborted"]},
    ]
    naive, k8 = gpu_report.CapacityRows(_Outcome(lines), SPEC, CFG)
    assert naive["layers"] == 2 and naive["vs_naive"] == 1.0
    assert (k8["row"], k8["stages"], k8["micro_batches"]) == ("pipeline K=8", 8, 4)
    assert (k8["layers_at_least"], k8["layers_below"], k8["estimate_layers"]) == (33, 35, 40)
    assert k8["params_m_at_least"] == pytest.approx(33 * 12.6)
    assert k8["vs_naive_at_least"] == pytest.approx(33 * 12.6 / 25.2)
    assert "stopped at its time budget" in k8["search"] and "layers" not in k8
    assert k8["probe_errors"] == ["35: Aborted"] and "probe_errors" not in naive


def test_no_lines_no_rows():
    assert gpu_report.CapacityRows(_Outcome([]), SPEC, CFG) == []


def test_markdown_has_each_section_its_table_or_its_reason():
    result = {
        "command": "python bench/gpu.py",
        "date": "2026-01-01T00:00:00+00:00",
        "wall_s": 400.0,
        "total_budget_s": 465,
        "machine": dict(
            device="NVIDIA H100 80GB HBM3",
            compute_capability="9.0",
            tf="2.21.0",
            cuda_build="12.5.1",
            cudnn_build="9",
            tensor_float_32=True,
            driver="580.159.04",
            cuda_driver="13.0",
            memory_total_mib=81559,
            first_step_s=12.5,
        ),  # fmt: skip
        "sections": {
            "capacity": {
                "rows": [
                    {"row": "naive, 1 device", "stages": 1, "layers": 2, "vs_naive": 1.0},
                    {
                        "row": "pipeline K=8",
                        "stages": 8,
                        "layers_at_least": 33,
                        "probe_errors": ["35: Aborted", "36: Aborted"],
                    },
                ],  # fmt: skip
                "ratio_k8_vs_naive": 16.5,
                "gpipe_reports": "25x at K=8 against naive (GPipe, Table 1)",
                "seconds": 250.0,
                "errors": ["stopped at its time budget after 250 s"],
            },
            "planner": {"skipped": "lingpipe.plan does not exist yet", "seconds": 0.0},
        },
    }
    text = gpu_report.Markdown(result)
    assert "- Device: NVIDIA H100 80GB HBM3, compute capability 9.0" in text
    assert "- TensorFlow 2.21.0 built with CUDA 12.5.1, cuDNN 9" in text
    assert "- Driver 580.159.04 (CUDA 13.0), 81559 MiB\n" in text
    assert "- First training step (kernels compiled on first use): 12.5 s" in text
    assert "| row | stages | layers | layers_at_least | vs_naive | probe_errors |" in text
    assert "| pipeline K=8 | 8 | - | 33 | - | 35: Aborted; 36: Aborted |" in text
    assert "K=8 against naive: 16.5x (GPipe reports 25x at K=8" in text
    assert "A part ended early: stopped at its time budget after 250 s." in text
    assert "## The planner: predicted against measured\n\nSkipped: lingpipe.plan does not" in text
