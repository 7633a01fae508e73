"""fvd's pytest plugin: write each test's real outcome into the JUnit report.

pytest's JUnit writer reports a non-strict xpass (an xfail-marked test that
passed) as a plain pass, which would let a stale scaffold count as parity.
This plugin stores the outcome pytest itself decided (passed, failed,
skipped, xfailed, xpassed, xpassed_strict, error) as the testcase property
``fvd_outcome``; fvd's verdict classifier reads it. Loaded by the worker with
``-p fvd_pytest_plugin`` from a scratch directory put on PYTHONPATH.
"""

import pytest

OUTCOME = "fvd_outcome"
XFAIL_REASON = "fvd_xfail_reason"


def _label(report):
    wasxfail = getattr(report, "wasxfail", None)
    if wasxfail is not None:
        return "xfailed" if report.skipped else "xpassed"
    if report.failed:
        if str(report.longrepr).startswith("[XPASS(strict)]"):
            return "xpassed_strict"
        return "failed" if report.when == "call" else "error"
    return report.outcome


# tryfirst makes this the outermost wrapper, so it sees the report after
# pytest's skipping plugin has turned it into an xfail or xpass.
@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    # One label per test: from the call phase, or from setup when the call
    # never ran (setup error, skip, xfail(run=False)).
    if report.when == "call" or (report.when == "setup" and not report.passed):
        props = [(OUTCOME, _label(report))]
        wasxfail = getattr(report, "wasxfail", None)
        if wasxfail:
            props.append((XFAIL_REASON, str(wasxfail).removeprefix("reason: ")))
        for prop in props:
            # The item's list feeds the teardown report the JUnit writer
            # reads; the report's own copy covers a call failure followed by
            # a teardown error, which pytest writes from the call report.
            item.user_properties.append(prop)
            report.user_properties.append(prop)
