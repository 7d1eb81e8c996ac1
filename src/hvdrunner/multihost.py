"""What a host needs before its ranks join a job that spans several hosts.

horovod 0.28.1's gloo *process-set* context (``GlooContext::InitializeForProcessSet``)
ignores ``HOROVOD_GLOO_IFACE`` and binds the address the machine's hostname resolves to.
Where that is a loopback address (Debian's installer and cloud-init's Debian/Ubuntu
``/etc/hosts`` template write ``127.0.1.1 <host>``), every cross-host connection goes to
127.0.0.1 and every rank aborts (SIGABRT, ``gloo::IoException ... Connection refused``)
right after ``hvd.init()``. The horovod that hvdrunner builds carries
``patches/horovod-0.28.1-gloo-process-set-iface.patch`` and is safe; for any other
horovod (e.g. the one preinstalled on DBR 15.4 LTS ML) :func:`check_host` refuses the
broken combination before the rank starts, naming the host, the cause and both fixes.

Pure Python, no TensorFlow: the launcher calls it in each Spark task, ``doctor`` on the
driver.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import ipaddress
import socket
from dataclasses import dataclass

from hvdrunner.errors import MultiHostSetupError

PATCH_FILE = "patches/horovod-0.28.1-gloo-process-set-iface.patch"
#: The module the patch adds to horovod: its presence marks a patched build.
MARKER_MODULE = "horovod._hvdrunner_gloo_iface"


def horovod_has_iface_patch() -> bool | None:
    """True when the installed horovod carries hvdrunner's gloo interface patch.

    ``None`` when horovod is not installed. Looks for the marker module the patch adds;
    horovod's native library is not loaded.

    Example:
        >>> horovod_has_iface_patch() in (True, False, None)
        True
    """
    if _horovod_version() is None:
        return None
    return importlib.util.find_spec(MARKER_MODULE) is not None


def _horovod_version() -> str | None:
    try:
        return md.version("horovod")
    except md.PackageNotFoundError:
        return None


def horovod_build() -> str:
    """This host's horovod, as a short label: version, and whether hvdrunner's patch is in.

    Example:
        >>> horovod_build()  # doctest: +SKIP
        '0.28.1 (hvdrunner gloo patch)'
    """
    version = _horovod_version()
    if version is None:
        return "none"
    patched = importlib.util.find_spec(MARKER_MODULE) is not None
    return f"{version} ({'hvdrunner gloo patch' if patched else 'no hvdrunner patch'})"


def hostname_address(hostname: str | None = None) -> str | None:
    """The address gloo binds for ``hostname`` (default: this machine's) when no interface
    is given: the first one ``getaddrinfo`` returns, as gloo's ``lookupAddrForHostname``
    takes it. ``None`` when the name does not resolve."""
    name = hostname or socket.gethostname()
    try:
        infos = socket.getaddrinfo(name, None, socket.AF_UNSPEC, socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


@dataclass(frozen=True)
class HostFacts:
    """What decides whether this host can run ranks of a multi-host job."""

    hostname: str
    address: str | None  # what the hostname resolves to (None: it does not)
    patched: bool | None  # horovod carries the gloo interface patch (None: no horovod)
    horovod: str | None

    @property
    def loopback_name(self) -> bool:
        """The hostname resolves to a loopback address, or not at all."""
        return self.address is None or ipaddress.ip_address(self.address.split("%")[0]).is_loopback

    @property
    def broken(self) -> bool:
        """Ranks here would abort in hvd.init() once peers live on other hosts."""
        return self.loopback_name and self.patched is False


def host_facts() -> HostFacts:
    """This host's name, what it resolves to, and whether horovod is patched."""
    name = socket.gethostname()
    return HostFacts(name, hostname_address(name), horovod_has_iface_patch(), _horovod_version())


def problem(facts: HostFacts, cluster_ip: str | None = None, iface: str | None = None) -> str:
    """The error text for a broken host: the host, the cause and both fixes."""
    resolves = (
        f"resolves to {facts.address}, a loopback address"
        if facts.address is not None
        else "does not resolve to any address"
    )
    where = f" ({cluster_ip})" if cluster_ip else ""
    via = f" ({iface})" if iface else ""
    entry = f"{cluster_ip or '<this host cluster address>'} {facts.hostname}"
    return (
        f"Host {facts.hostname}{where} cannot run ranks of a multi-host job: its hostname "
        f"{resolves}, and the installed horovod {facts.horovod} lacks hvdrunner's gloo "
        f"interface patch ({PATCH_FILE}). Unpatched horovod 0.28.1 connects its gloo "
        f"process set through the hostname's address instead of HOROVOD_GLOO_IFACE{via}, so "
        f"ranks on other hosts could not connect and every rank would abort in hvd.init() "
        f"(gloo::IoException ... Connection refused). Fix either: (1) install the horovod "
        f"hvdrunner builds (PYTHON=$(which python) bash scripts/install_horovod.sh, or the "
        f"bundle's init script), which carries the patch; or (2) make the hostname resolve "
        f"to the host's cluster address on every host, e.g. '{entry}' in /etc/hosts in place "
        f"of a 127.0.1.1 line."
    )


def check_host(num_hosts: int, cluster_ip: str | None = None, iface: str | None = None) -> None:
    """Raise before a rank starts when this host would break a job over ``num_hosts`` hosts.

    Raises:
        MultiHostSetupError: ``num_hosts > 1``, the hostname resolves to loopback (or not
            at all) and horovod lacks the gloo interface patch.

    Example:
        >>> check_host(num_hosts=1)  # a single-host job never needs it
    """
    if num_hosts <= 1:
        return
    facts = host_facts()
    if facts.broken:
        raise MultiHostSetupError(problem(facts, cluster_ip, iface))
