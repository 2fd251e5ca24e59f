"""tests/conftest.py fails a test that leaves a process-wide setting changed, and puts
the setting back for the tests after it."""

import pathlib
import textwrap

pytest_plugins = ["pytester"]


def test_a_test_that_leaves_the_dtype_policy_changed_fails_and_the_next_sees_float32(pytester):
    pytester.makeconftest((pathlib.Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_leaks=textwrap.dedent(
            """
            import keras

            def test_a_leaks():
                keras.mixed_precision.set_global_policy("mixed_bfloat16")

            def test_b_sees_float32():
                assert keras.mixed_precision.global_policy().name == "float32"
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_a_leaks*",
            "*keras.mixed_precision.global_policy(): was 'float32', now 'mixed_bfloat16'*",
        ]
    )


def test_grappler_is_on_only_for_tests_marked_so(pytester):
    pytester.makeconftest((pathlib.Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(
        test_grappler=textwrap.dedent(
            """
            import pytest
            import tensorflow as tf

            def Off():
                return tf.config.optimizer.get_experimental_options()["disable_meta_optimizer"]

            def test_a_unmarked_runs_without():
                assert Off()

            @pytest.mark.grappler
            def test_b_marked_runs_with():
                assert not Off()

            def test_c_and_the_next_without_again():
                assert Off()
            """
        )
    )
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "0")
    result.assert_outcomes(passed=3)
