"""The checks of ``laxflow doctor``: is this node ready for a daemon and a job under the shim?

``laxflow.doctor_cli`` runs :func:`run_checks` once, in the operator's shell,
before ``laxflow daemon`` starts; nothing here changes the node. Each check
returns one :class:`Check`: its status (``ok``, ``warn``: works but not as
well as it could, ``fail``: laxflow will not schedule this node until it is
fixed), what was found, and what to do. Checks read the environment mapping
they are given (the CLI passes the shell's), never ``os.environ`` directly.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping

from laxflow.errors import UserError

OK, WARN, FAIL = "ok", "warn", "fail"
SHM_DIR = Path("/dev/shm")


@dataclass(frozen=True)
class Check:
    status: str  # ok | warn | fail
    name: str  # shim, ports, shm, user, env, dscp
    found: str  # what the check saw, one line
    todo: str  # what to do ("" when nothing)

    def line(self) -> str:
        text = f"{self.status:4}  {self.name:5}  {self.found}"
        return f"{text} -- {self.todo}" if self.todo else text

    def as_dict(self) -> dict:
        return asdict(self)


# ------------------------------------------------------------------ shim


def check_shim() -> Check:
    """liblaxflow_shim.so is where ``laxflow shim-path`` looks, and it dlopens in a child process."""
    from laxflow.shim import shim_path

    try:
        path = shim_path()
    except UserError as exc:
        return Check(FAIL, "shim", str(exc), "build it: make -C native OUT=$PWD/src/laxflow/_native "
                                             "(or pip install -e . with libibverbs-dev present)")
    # A child: the shim's constructor runs there, not in this process.
    probe = "import ctypes, sys; ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)"
    try:
        done = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return Check(FAIL, "shim", f"{path}: loading it hung for 30 s", "rebuild the shim; report it")
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return Check(FAIL, "shim", f"{path} does not load: {why}",
                     "install the libraries it names (ldd it), then rebuild: make -C native")
    return Check(OK, "shim", f"{path} builds and loads (dlopen in a child)", "")


# ------------------------------------------------------------------ ports


def check_ports(ports: str, sysfs: Path | None = None) -> Check:
    """The line rates the daemon will schedule: a ports file, or sysfs (``auto``)."""
    from laxflow.daemon.ports import SYSFS_NET, load_ports_file

    if ports != "auto":
        try:
            specs = load_ports_file(ports)
        except UserError as exc:
            return Check(FAIL, "ports", str(exc), "fix the ports file (see laxflow daemon --help)")
        rates = ", ".join(f"{p.name} {p.rate * 8 / 1e9:g} Gbit/s" for p in specs)
        return Check(OK, "ports", f"{ports}: {rates}", "")
    root = sysfs or SYSFS_NET
    good, none = [], []
    for dev in sorted(root.iterdir()) if root.is_dir() else []:
        if dev.name == "lo":
            continue
        try:
            mbps = int((dev / "speed").read_text().strip())
        except (OSError, ValueError):
            continue  # no speed file or EINVAL: a virtual interface (ifb, bridge), not a NIC
        (good if mbps > 0 else none).append((dev.name, mbps))
    if good:
        rates = ", ".join(f"{n} {m / 1000:g} Gbit/s" for n, m in good)
        return Check(OK, "ports", f"sysfs: {rates}", "")
    if none:
        seen = ", ".join(f"{n} speed {m}" for n, m in none)
        return Check(WARN, "ports", f"sysfs: no link speed ({seen}; -1 is what virtio and other virtual NICs "
                                    f"report)", "give the rate: laxflow daemon --line-rate GBPS, or --ports FILE")
    return Check(WARN, "ports", f"sysfs: no network interface under {root} but lo",
                 "pass laxflow daemon --ports FILE naming the NICs and their Gbit/s")


# ------------------------------------------------------------------ /dev/shm


def check_shm_dir(shm_dir: Path = SHM_DIR) -> Check:
    """The daemon creates its segment there: writable, with room."""
    probe = shm_dir / f".laxflow-doctor-{os.getpid()}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        try:
            os.write(fd, b"\0" * 4096)
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        return Check(FAIL, "shm", f"{shm_dir} not writable: {exc.strerror}",
                     f"mount a tmpfs there (mount -t tmpfs tmpfs {shm_dir}) or run the daemon as a user who "
                     f"may write it")
    free = shutil.disk_usage(shm_dir).free
    return Check(OK, "shm", f"{shm_dir} writable, {free / 2**20:.0f} MiB free", "")


# ------------------------------------------------------------------ the job's user


def _reaches(uid: int, gids: set[int], st: os.stat_result) -> bool:
    """Whether a user (uid, its groups) may read and write a file of this owner and mode."""
    if uid == 0:
        return True
    rw = stat.S_IRUSR | stat.S_IWUSR
    if st.st_uid == uid:
        return st.st_mode & rw == rw
    rw_g = stat.S_IRGRP | stat.S_IWGRP
    if st.st_gid in gids:
        return st.st_mode & rw_g == rw_g
    rw_o = stat.S_IROTH | stat.S_IWOTH
    return st.st_mode & rw_o == rw_o


def _groups(user: pwd.struct_passwd) -> set[int]:
    return {user.pw_gid} | {g.gr_gid for g in grp.getgrall() if user.pw_name in g.gr_mem}


def check_user(user: str, group: str | None, shm: str, hooks_path: str) -> Check:
    """Whether ``user`` (the serving job's) can open the daemon's segment and hooks socket.

    A live daemon's files are checked as they are (owner, group, mode); before
    one starts, the daemon to come runs as this user with ``group``.
    """
    try:
        job = pwd.getpwnam(user)
    except KeyError:
        return Check(FAIL, "user", f"no such user {user!r}", "name the user the serving job runs as")
    gids = _groups(job)
    seg = SHM_DIR / shm.lstrip("/")
    present = [p for p in (seg, Path(hooks_path)) if p.exists()]
    if present:
        denied = [p for p in present if not _reaches(job.pw_uid, gids, p.stat())]
        if not denied:
            return Check(OK, "user", f"{user} can open {', '.join(map(str, present))}", "")
        st = denied[0].stat()
        owner, mode = _owner(st), stat.S_IMODE(st.st_mode)
        gname = _group_name(st.st_gid)
        todo = (f"add {user} to group {gname}: usermod -aG {gname} {user}" if mode & 0o060 == 0o060 else
                f"restart the daemon with --group G (config key 'group'; files mode 0660) and add {user} to G")
        return Check(FAIL, "user", f"{user} cannot open {denied[0]} (owner {owner}, group {gname}, mode "
                                   f"{mode:04o}): the shim would pass everything through", todo)
    me = os.geteuid()
    if job.pw_uid == me or job.pw_uid == 0:
        return Check(OK, "user", f"{user} is the daemon's user (segment mode 0600 is enough)", "")
    if group is None:
        return Check(FAIL, "user", f"{user} is not the daemon's user ({pwd.getpwuid(me).pw_name}) and no --group "
                                   f"is given: the segment would be mode 0600",
                     f"start the daemon with --group G (config key 'group') where {user} is in G "
                     f"(usermod -aG G {user}), and run laxflow doctor --user {user} --group G")
    try:
        g = grp.getgrnam(group)
    except KeyError:
        return Check(FAIL, "user", f"no such group {group!r}",
                     f"groupadd --system {group} && usermod -aG {group} {user}")
    if g.gr_gid not in gids:
        return Check(FAIL, "user", f"{user} is not in group {group}", f"usermod -aG {group} {user} "
                                                                     f"(then restart the job's session)")
    return Check(OK, "user", f"{user} is in group {group}: segment and hooks socket mode 0660 will reach it", "")


def _owner(st: os.stat_result) -> str:
    try:
        return pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        return str(st.st_uid)


def _group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


# ------------------------------------------------------------------ environment


def check_env(env: Mapping[str, str]) -> Check:
    """NCCL / Mooncake variables and LD_PRELOAD as a job started from this shell would inherit them."""
    from laxflow.shim import SHIM_FILE

    notes, todo = [], []
    preload = [p for p in env.get("LD_PRELOAD", "").replace(":", " ").split() if p]
    others = [p for p in preload if Path(p).name != SHIM_FILE]
    notes.append(f"LD_PRELOAD={' '.join(preload) or '(empty)'}")
    if others:
        todo.append(f"other preloads ({', '.join(others)}) run after the shim under laxflow run; check that none "
                    f"wraps ibv_post_send or connect itself")
    if "NCCL_IB_TC" in env:
        notes.append(f"NCCL_IB_TC={env['NCCL_IB_TC']}")
        todo.append("NCCL_IB_TC is set here: laxflow run --collectives nccl keeps it instead of the collective "
                    "class (DSCP 38 -> 152); unset it unless that is meant")
    if env.get("NCCL_NET_PLUGIN"):
        notes.append(f"NCCL_NET_PLUGIN={env['NCCL_NET_PLUGIN']}")
        todo.append("a NCCL net plugin may post verbs from its own library: check its QPs reach the shim "
                    "(laxflow status shows their events)")
    mc = sorted(k for k in env if k.startswith("MC_"))
    if mc:
        notes.append(" ".join(f"{k}={env[k]}" for k in mc))
    if "MC_IB_TC" in env:
        todo.append("MC_IB_TC keeps Mooncake's own class on its QPs (laxflow still gates them); unset it for "
                    "per-level DSCP")
    return Check(WARN if todo else OK, "env", "; ".join(notes), "; ".join(todo))


# ------------------------------------------------------------------ DSCP trust on the NIC


def check_dscp(which=shutil.which) -> Check:
    """Whether the tools to make the NIC trust DSCP are here (laxflow testbed switch-config knows the commands)."""
    mlnx, dcb = which("mlnx_qos"), which("dcb")
    if mlnx:
        return Check(WARN, "dscp", f"mlnx_qos at {mlnx}; trust state not checked",
                     "see it with mlnx_qos -i IF (want 'Priority trust state: dscp'); set it with "
                     "laxflow testbed switch-config --vendor sonic --nic mlnx (prints the mlnx_qos lines)")
    if dcb:
        return Check(WARN, "dscp", f"dcb at {dcb} (iproute2), no mlnx_qos",
                     "make the NIC trust DSCP: dcb apptrust set dev IF order dscp; and the switch: "
                     "laxflow testbed switch-config --vendor sonic|onyx|cumulus")
    return Check(WARN, "dscp", "neither mlnx_qos nor dcb found: the NIC's DSCP trust cannot be set from here",
                 "install mlnx-tools (ConnectX) or iproute2's dcb; laxflow testbed switch-config prints the commands")


# ------------------------------------------------------------------ all


def run_checks(ports: str, user: str | None, group: str | None, shm: str, hooks_path: str,
               env: Mapping[str, str]) -> list[Check]:
    """Every check, in the order an operator fixes them."""
    checks = [check_shim(), check_ports(ports), check_shm_dir()]
    if user is not None:
        checks.append(check_user(user, group, shm, hooks_path))
    checks += [check_env(env), check_dscp()]
    return checks
