"""One Slurm cluster of two nodes on this machine, and one tunedeck server using it, for tests/slurm.

Debian's `slurm-wlm` and `munge` (scripts/setup.sh dev installs them): a munged of our own (its own
key and socket), a slurmctld and two slurmd (`n1`, `n2`, one logical GPU each, as GRES) with every
state, spool, log and pid file in a temporary folder. Nothing here touches a cluster already on the
machine: the cluster name, the daemons' ports and the socket are this session's own. The
trainers run on the CPU (gloo), as everywhere in CI, while allocation, the batch script, srun and the
rendezvous go through Slurm exactly as on a real cluster.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.utils.servers import Server, free_port
from tests.utils.wait import until

pytestmark = pytest.mark.slow
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")


def slurm_conf(root: Path, *, cluster: str, port: int, node_ports: dict[str, int]) -> str:
    host = socket.gethostname()
    lines = [
        f"ClusterName={cluster}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge.socket",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/backfill",
        "MpiDefault=none",
        "GresTypes=gpu",
        "ReturnToService=2",
        "SlurmdTimeout=20",  # a killed slurmd marks its node DOWN (and fails its job) within ~20 s
        "KillWait=20",  # scancel's SIGTERM to the end: the runners' graceful stop has this long
        "MinJobAge=600",  # ended jobs stay in squeue/scontrol for the server to read how they ended
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/slurmctld.log",
        f"SlurmdLogFile={root}/slurmd-%n.log",
    ]
    for name, node_port in node_ports.items():
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={node_port} "
            "CPUs=2 RealMemory=4000 Gres=gpu:1"
        )
    # Preemption as sites set it up for scavenger queues: `urgent` jobs take tdk's nodes; a tdk job
    # gets the --signal warning at once (22.05's spelling of send_user_signal) and GraceTime to stop.
    lines += [
        "PreemptType=preempt/partition_prio",
        "PreemptMode=CANCEL",
        "SlurmctldParameters=preempt_send_user_signal",
        f"PartitionName=tdk Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP PriorityTier=1 "
        "GraceTime=120",
        f"PartitionName=urgent Nodes={','.join(NODES)} MaxTime=5 State=UP PriorityTier=10 PreemptMode=OFF",
    ]
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """The processes of the session's cluster, started in `root` and stopped by their pids."""

    def __init__(self, root: Path):
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.cluster = f"tdk{secrets.token_hex(3)}"

    def run(self, *args: str) -> str:
        return subprocess.run(args, env=self.env, capture_output=True, text=True, check=True).stdout

    def start(self) -> SlurmCluster:
        r = self.root
        for d in ("state", "spool/n1", "spool/n2", "gpus"):
            (r / d).mkdir(parents=True, exist_ok=True)
        key = r / "munge.key"
        key.write_bytes(secrets.token_bytes(1024))
        key.chmod(0o600)
        # Free ports of this session's own (a second session's cluster on the machine gets others).
        taken: list[int] = []
        while len(taken) < len(NODES) + 1:
            if (p := free_port()) not in taken:
                taken.append(p)
        ports = dict(zip(NODES, taken))
        self.conf.write_text(slurm_conf(r, cluster=self.cluster, port=taken[-1], node_ports=ports))
        gres = ["AutoDetect=off"]
        for name in NODES:
            dev = r / "gpus" / f"{name}-gpu0"
            dev.touch()
            gres.append(f"NodeName={name} Name=gpu File={dev}")
        (r / "gres.conf").write_text("\n".join(gres) + "\n")
        subprocess.run(
            [
                "munged",
                "--force",
                f"--socket={r}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={r}/munged.pid",
                f"--log-file={r}/munged.log",
                f"--seed-file={r}/munged.seed",
            ],
            check=True,
            capture_output=True,
        )
        subprocess.run(["slurmctld", "-f", str(self.conf)], env=self.env, check=True)
        for name in NODES:
            subprocess.run(["slurmd", "-f", str(self.conf), "-N", name], env=self.env, check=True)
        until(lambda: self.states() == {"n1": "idle", "n2": "idle"}, "both Slurm nodes idle", timeout=120)
        return self

    def states(self) -> dict[str, str]:
        try:
            out = self.run("sinfo", "-h", "-N", "-o", "%N %t")
        except subprocess.CalledProcessError:
            return {}  # the controller is not answering yet
        return dict(line.split() for line in out.splitlines() if line.strip())

    def pids(self) -> list[int]:
        files = ["slurmd-n1.pid", "slurmd-n2.pid", "slurmctld.pid", "munged.pid"]
        out = []
        for f in files:
            try:
                out.append(int((self.root / f).read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                continue
        return out

    def stop(self) -> None:
        """Every job of the cluster ended first (slurmstepd outlives slurmd: its steps would run on),
        then the daemons by their pids."""
        try:
            self.run("scancel", "--full", "--signal=KILL", "--user=root")
            until(lambda: not self.run("squeue", "-h", "-o", "%i").strip(), "no job left on the cluster", 60)
        except (subprocess.CalledProcessError, AssertionError):
            pass  # a controller that does not answer: its daemons go below all the same
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            until(lambda pid=pid: not _running(pid), f"Slurm daemon {pid} stopped", timeout=60)
        for step in self.stepds():  # a node's slurmd killed by a test leaves its slurmstepd behind
            step.kill()

    def stepds(self) -> list[psutil.Process]:
        """This cluster's slurmstepd processes (they run in its folder)."""
        out = []
        for p in psutil.process_iter(["name"]):
            try:
                if p.info["name"] == "slurmstepd" and p.cwd().startswith(str(self.root)):
                    out.append(p)
            except psutil.Error:
                continue
        return out


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an exited child of ours would linger as a zombie: reap it if it is one
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    return Path(f"/proc/{pid}").exists() and "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        pytest.skip(
            f"Slurm is not installed ({', '.join(missing)} missing; scripts/setup.sh dev installs it)"
        )
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def slurm_settings(cluster: SlurmCluster) -> dict[str, str]:
    """A server's environment for the cluster: the slurm executor on its partition."""
    return {
        "SLURM_CONF": str(cluster.conf),
        "TUNEDECK_EXECUTOR": "slurm",
        "TUNEDECK_CANCEL_ABORT_GRACE_S": "60",
        # Slurm warns a job this long before its time limit (up to a minute early): only the time-limit
        # test gives a limit short enough for that to matter.
        "TUNEDECK_SLURM_WARN_S": "150",
    }


@pytest.fixture(scope="module")
def slurm_server(slurm_cluster, assets, tmp_path_factory):
    """The server, with the slurm executor on the cluster's partition; one per test module."""
    server = Server(tmp_path_factory.mktemp("slurmws") / "ws", assets, **slurm_settings(slurm_cluster))
    yield server.start()
    server.stop()


@pytest.fixture(autouse=True)
def nothing_left_on_the_cluster(request):
    """After each test, every Slurm job it left is cancelled and gone: a test that fails mid-job (its
    own cleanup never reached) would otherwise hold both nodes, and the next test would wait behind it
    and fail for a reason of someone else's."""
    yield
    if "slurm_cluster" not in request.fixturenames:
        return
    cluster = request.getfixturevalue("slurm_cluster")
    if not cluster.run("squeue", "-h", "-o", "%i").strip():
        return
    cluster.run("scancel", "--full", "--user=root")
    until(lambda: not cluster.run("squeue", "-h", "-o", "%i").strip(), "no job left on the cluster", 120)
