"""hvdrunner.multihost: when a host is refused for a multi-host job, and what it is told.

The end-to-end check (a real loopback-named host refusing unpatched horovod before
hvd.init()) is in test_multihost.py; these pin the rule and the wording."""

from __future__ import annotations

import pytest

from hvdrunner import MultiHostSetupError, multihost
from hvdrunner.multihost import HostFacts


@pytest.mark.parametrize(
    ("address", "patched", "broken"),
    [
        ("127.0.1.1", False, True),  # Debian / cloud-init /etc/hosts, stock horovod
        ("::1", False, True),
        (None, False, True),  # the hostname does not resolve at all
        ("127.0.1.1", True, False),  # hvdrunner's horovod
        ("10.1.2.3", False, False),  # hostname resolves to the cluster address
        ("127.0.1.1", None, False),  # no horovod: nothing to say here
    ],
)
def test_broken_is_loopback_name_and_unpatched_horovod(address, patched, broken):
    assert HostFacts("h", address, patched, "0.28.1").broken is broken


def test_problem_names_host_cause_and_both_fixes():
    text = multihost.problem(HostFacts("node7", "127.0.1.1", False, "0.28.1"), "10.0.0.7", "eth0")
    assert text.startswith("Host node7 (10.0.0.7) cannot run ranks of a multi-host job")
    assert "resolves to 127.0.1.1, a loopback address" in text
    assert "horovod 0.28.1 lacks" in text and multihost.PATCH_FILE in text
    assert "HOROVOD_GLOO_IFACE (eth0)" in text
    assert "scripts/install_horovod.sh" in text and "'10.0.0.7 node7' in /etc/hosts" in text


def test_check_host_refuses_only_jobs_over_several_hosts(monkeypatch):
    monkeypatch.setattr(
        multihost, "host_facts", lambda: HostFacts("n", "127.0.1.1", False, "0.28.1")
    )
    multihost.check_host(num_hosts=1)  # one host: loopback gloo works
    with pytest.raises(MultiHostSetupError, match="Host n cannot run ranks"):
        multihost.check_host(num_hosts=2)


@pytest.mark.stacks("15.4", "18")  # each stack builds its own horovod
def test_this_stacks_horovod_carries_the_patch():
    # hvdrunner builds horovod with the patch on every stack (scripts/install_horovod.sh)
    assert multihost.horovod_has_iface_patch() is True
