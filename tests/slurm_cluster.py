"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd, and with
``accounting`` a real slurmdbd on its own MariaDB, so that ``sacct`` prints what it
prints at a site.

Everything lives in one folder: its own munge key and socket, ``slurm.conf`` and
``gres.conf`` (one node ``gpu-node-1`` with ``Gres=gpu:h100:8`` backed by eight
placeholder files ``dev/nvidia0..7``), state and spool folders, logs. The daemons run in
the foreground as children of the test process on free ports and are stopped at the
end. Clients find the cluster through ``SLURM_CONF`` (see :meth:`SlurmCluster.env`).

Needs Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge``, and for
accounting ``slurmdbd`` and ``mariadb-server`` (``scripts/setup.d/20-slurm.sh``), and
root (slurmd runs jobs as their user).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

NODE = "gpu-node-1"
PARTITION = "gpu"
URGENT = "urgent"
"""A second partition on the same node whose jobs preempt (requeue) the first one's."""
GPUS = 8
REQUIRED = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
ACCOUNTING = ("slurmdbd", "sacct", "sacctmgr", "mariadbd", "mariadb-install-db")
CLUSTER = "gpuledger-test"


def missing_tools(accounting: bool = False) -> list[str]:
    return [tool for tool in REQUIRED + (ACCOUNTING if accounting else ())
            if shutil.which(tool) is None]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class SlurmCluster:
    root: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    accounting: bool = False
    """Run slurmdbd (on a MariaDB of its own) and record jobs there: ``sacct`` works."""

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    # -- set up ----------------------------------------------------------------------

    def write_config(self) -> None:
        for sub in ("etc", "dev", "state", "spool", "log", "munge", "run",
                    *(("db",) if self.accounting else ())):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
            os.chmod(self.root / sub, 0o700)
        os.chmod(self.root, 0o755)
        for i in range(GPUS):
            (self.root / "dev" / f"nvidia{i}").write_text("")
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, slurmd_port = _free_port(), _free_port()
        r = self.root
        self.conf.write_text(f"""\
ClusterName={CLUSTER}
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={r}/run/slurmctld.pid
SlurmdPidFile={r}/run/slurmd.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
{self._accounting_config()}
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=1
GresTypes=gpu
ReturnToService=2
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=600
KillWait=2
PlugStackConfig={r}/etc/plugstack.conf
NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 CPUs=32 Sockets=1 \
CoresPerSocket=32 ThreadsPerCore=1 RealMemory=64000 Gres=gpu:h100:{GPUS} State=UNKNOWN
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName={URGENT} Nodes={NODE} MaxTime=INFINITE State=UP PriorityTier=2
""")
        (r / "etc" / "plugstack.conf").write_text("")
        (r / "etc" / "gres.conf").write_text(
            f"AutoDetect=off\nNodeName={NODE} Name=gpu Type=h100 "
            f"File={r}/dev/nvidia[0-{GPUS - 1}]\n")

    def _accounting_config(self) -> str:
        if not self.accounting:
            return "AccountingStorageType=accounting_storage/none"
        r = self.root
        self.db_port, self.dbd_port = _free_port(), _free_port()
        dbd = r / "etc" / "slurmdbd.conf"
        dbd.write_text(f"""\
AuthType=auth/munge
AuthInfo=socket={r}/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort={self.dbd_port}
SlurmUser=root
LogFile={r}/log/slurmdbd.log
PidFile={r}/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort={self.db_port}
StorageUser=root
StorageLoc=slurm_acct_db
""")
        os.chmod(dbd, 0o600)  # slurmdbd refuses a config others can read
        # AccountingStoragePass names the munge socket for slurmdbd's connections; GPUs
        # are recorded in AllocTRES only when listed in AccountingStorageTRES, as at a site
        return (f"AccountingStorageType=accounting_storage/slurmdbd\n"
                f"AccountingStorageHost=localhost\nAccountingStoragePort={self.dbd_port}\n"
                f"AccountingStoragePass={r}/munge/munge.socket\n"
                "AccountingStorageTRES=gres/gpu,gres/gpu:h100")

    def start(self, timeout_s: float = 60.0) -> None:
        """Start the daemons and wait until the node is idle; on failure stop them again."""
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        self.write_config()
        r = self.root
        self._spawn(["munged", "--foreground", "--force",
                     f"--key-file={r}/munge/munge.key", f"--socket={r}/munge/munge.socket",
                     f"--pid-file={r}/munge/munged.pid", f"--log-file={r}/log/munged.log",
                     f"--seed-file={r}/munge/munged.seed"], "munged")
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 10, "munged socket")
        if self.accounting:
            self._start_slurmdbd(timeout_s)
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._wait(self._ctld_up, timeout_s, "slurmctld to answer")
        self._spawn(["slurmd", "-D", "-N", NODE, "-f", str(self.conf)], "slurmd")
        self._wait(self._node_idle, timeout_s, f"{NODE} to be idle")

    def _start_slurmdbd(self, timeout_s: float) -> None:
        """MariaDB on a data folder of its own (loopback, no grant tables: only this
        slurmdbd reaches it), slurmdbd on it, and the cluster registered there."""
        r = self.root
        subprocess.run(["mariadb-install-db", "--user=root", f"--datadir={r}/db",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self._spawn(["mariadbd", "--no-defaults", "--user=root", f"--datadir={r}/db",
                     f"--socket={r}/run/db.sock", f"--port={self.db_port}",
                     "--bind-address=127.0.0.1", "--skip-grant-tables",
                     f"--pid-file={r}/run/db.pid", "--innodb-buffer-pool-size=32M"],
                    "mariadbd")
        self._wait(lambda: (r / "run" / "db.sock").exists(), timeout_s, "MariaDB")
        self._spawn(["slurmdbd", "-D"], "slurmdbd")
        self._wait(lambda: self.run("sacctmgr", "-i", "add", "cluster", CLUSTER,
                                    check=False).returncode == 0, timeout_s,
                   "slurmdbd to register the cluster")

    def _spawn(self, argv: list[str], name: str) -> None:
        out = open(self.root / "log" / f"{name}.stdout", "wb")  # noqa: SIM115
        self.procs.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           env=self.env(), start_new_session=True))

    def _wait(self, ready: object, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} "
                                       f"while waiting for {what}:\n{self.logs()}")
            if ready():  # type: ignore[operator]
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out waiting for {what}:\n{self.logs()}")

    def _ctld_up(self) -> bool:
        return self.run("scontrol", "ping", check=False).returncode == 0

    def _node_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%T", check=False).stdout.split()
        return bool(out) and set(out) == {"idle"}  # one line per partition

    def logs(self) -> str:
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)

    # -- use -------------------------------------------------------------------------

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), env=self.env(), capture_output=True, text=True,
                              check=check, timeout=30)

    def sbatch(self, gpus: int, seconds: int, name: str = "job", *extra: str,
               then: str = "") -> str:
        """Submit ``sleep seconds`` (then the shell command ``then``: ``exit 3``...)."""
        script = f"sleep {seconds}" + (f"; {then}" if then else "")
        out = self.run("sbatch", "--parsable", f"--job-name={name}", f"--gres=gpu:h100:{gpus}",
                       "-n", "1", "-o", "/dev/null", *extra, "--wrap", script).stdout
        return out.strip().split(";")[0]

    # -- tear down -------------------------------------------------------------------

    def stop(self) -> None:
        # cancel this cluster's jobs first, so that their slurmstepd and sleep processes end
        if self.procs and all(p.poll() is None for p in self.procs):
            ids = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if ids:
                self.run("scancel", *ids, check=False)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.run(
                        "squeue", "-h", "-t", "R,CG", "-o", "%i", check=False).stdout.strip():
                    time.sleep(0.3)
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()
