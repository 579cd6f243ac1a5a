"""`lkv sweep` on a cluster: every grid point as one job of a SLURM job array, submitted through submitit.

The ``launcher:`` section of a sweep config (:class:`Launcher`) names the executor and the resources of
*one point's* job. Each job calls the same :func:`lkv.sweep.points.run_point` as the local mode, so a
point's ``result.json`` is the same whichever way it ran; ``lkv sweep --summarize true`` collects them.

A point that trains on G GPUs runs as G tasks of one job (``tasks_per_node = gpus_per_node``): submitit
starts the job's function under ``srun`` in every task, each task starts ``lkv fit`` as a child that
inherits the task's ``SLURM_*`` variables, and Lightning's ``SLURMEnvironment`` makes those children one
DDP group (rank ``SLURM_PROCID``, world size ``SLURM_NTASKS``, GPU ``SLURM_LOCALID``; Lightning checks
that ``trainer.devices`` equals ``--ntasks-per-node``). Only task 0 then times, evaluates and writes the
result.

Submitit's files (pickled calls, results, ``<job>_0_log.out``/``.err``) go to ``launcher.folder``
(default ``<output>/jobs``); ``points/<point>/job.json`` records which job runs a point.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import submitit
from submitit.core.utils import JobPaths, pickle_load

from lkv.sweep.grid import point_name
from lkv.sweep.points import RESULT_FILE, fit_values, point_config, run_point

JOB_FILE = "job.json"
JOBS_FOLDER = "jobs"
Executor = Literal["slurm", "local"]
# sacct states of a job that may still write into its point folder: such a point is not submitted again
ACTIVE_STATES = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED"}


@dataclasses.dataclass(frozen=True)
class Launcher:
    """Resources of one grid point's job (the ``launcher:`` section of a sweep config).

    Attributes:
        executor: ``slurm`` (a job array on the cluster this runs on: ``srun`` must be on the PATH) or
            ``local`` (submitit's local executor: each job a background process of this machine, to try
            the array path without a cluster).
        nodes: nodes per point; must equal the points' ``trainer.num_nodes``.
        gpus_per_node: GPUs per node (``--gpus-per-node``); 0 for CPU points.
        tasks_per_node: tasks per node (``--ntasks-per-node``), one DDP rank each; default
            ``gpus_per_node`` (1 without GPUs). Under SLURM it must equal the points' ``trainer.devices``.
        cpus_per_task: CPUs per task (``--cpus-per-task``); none: the cluster's default.
        mem_gb: memory per node in GB (``--mem``); none: the cluster's default.
        timeout_min: time limit of one point's job in minutes (``--time``).
        partition: SLURM partition (``--partition``); none: the cluster's default.
        array_parallelism: most jobs of the array running at once (``--array=0-N%k``).
        slurm_args: further ``#SBATCH`` flags, name → value (``{account: x, qos: high, constraint: h100}``).
        setup: shell lines run in the job before the point (``module load ...``, ``source .venv/bin/activate``).
        name: job name (``--job-name``).
        folder: submitit's folder (pickles and logs); default ``<output>/jobs``.
        wait: block until every submitted job has ended, then summarise (as ``--summarize true`` would).
    """

    executor: Executor = "slurm"
    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    mem_gb: float | None = None
    timeout_min: int = 60
    partition: str | None = None
    array_parallelism: int = 256
    slurm_args: dict[str, Any] = dataclasses.field(default_factory=dict)
    setup: list[str] = dataclasses.field(default_factory=list)
    name: str = "lkv-sweep"
    folder: str | None = None
    wait: bool = False

    @property
    def tasks(self) -> int:
        """Tasks per node: ``tasks_per_node``, else one per GPU (at least one)."""
        return self.tasks_per_node if self.tasks_per_node is not None else max(1, self.gpus_per_node)


def parse_launcher(section: dict[str, Any]) -> Launcher:
    """The :class:`Launcher` of a sweep config's ``launcher:`` mapping.

    Raises:
        ValueError: naming the ``launcher.<key>`` that is unknown or of the wrong type or range.
    """
    if not isinstance(section, dict):
        raise ValueError(f"launcher: expected a mapping of job resources, found {section!r}")
    fields = {f.name: f for f in dataclasses.fields(Launcher)}
    for key, value in section.items():
        if key not in fields:
            raise ValueError(f"launcher.{key}: unknown key; expected one of {', '.join(fields)}")
        expected = _expected_type(key, value)
        if expected is not None:
            raise ValueError(f"launcher.{key}: expected {expected}, found {value!r}")
    launcher = Launcher(**section)
    if launcher.executor == "local" and (launcher.nodes != 1 or launcher.tasks != 1):
        raise ValueError(
            "launcher.executor: local runs one task on this machine (Lightning starts a point's DDP "
            f"processes itself); found nodes={launcher.nodes}, tasks_per_node={launcher.tasks} (set "
            "nodes: 1, tasks_per_node: 1)"
        )
    return launcher


def _expected_type(key: str, value: Any) -> str | None:
    """What ``launcher.<key>`` expects, if ``value`` is not that; else None."""
    positive = {"nodes", "timeout_min", "array_parallelism"}
    optional_positive = {"tasks_per_node", "cpus_per_task"}
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if key == "executor" and value not in get_args(Executor):
        return f"one of {', '.join(get_args(Executor))}"
    if key in positive and not (is_int and value > 0):
        return "a positive integer"
    if key in optional_positive and not (value is None or (is_int and value > 0)):
        return "a positive integer or null"
    if key == "gpus_per_node" and not (is_int and value >= 0):
        return "a non-negative integer"
    if key == "mem_gb" and not (value is None or (isinstance(value, int | float) and value > 0)):
        return "a positive number of GB or null"
    if key in ("partition", "folder") and not (value is None or isinstance(value, str)):
        return "a string or null"
    if key == "name" and not (isinstance(value, str) and value):
        return "a non-empty string"
    if key == "slurm_args" and not isinstance(value, dict):
        return "a mapping of sbatch flag → value"
    if key == "setup" and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return "a list of shell lines"
    if key == "wait" and not isinstance(value, bool):
        return "true or false"
    return None


def check_points_fit(launcher: Launcher, configs: dict[str, dict[str, Any]]) -> None:
    """Refuse, before anything is queued, points whose trainer Lightning would refuse inside the job.

    Under SLURM Lightning runs one DDP rank per task and refuses a ``trainer.devices`` other than
    ``--ntasks-per-node``; ``trainer.num_nodes`` must be the job's node count. ``configs``: point name →
    its fit config.

    Raises:
        ValueError: naming the launcher field, the point and the trainer setting that disagree.
    """
    if launcher.executor != "slurm":
        return
    for name, config in configs.items():
        trainer = config.get("trainer") or {}
        devices, num_nodes = job_devices(trainer, launcher), trainer.get("num_nodes", 1)
        if devices is not None and devices != launcher.tasks:
            raise ValueError(
                f"launcher.tasks_per_node: {launcher.tasks} tasks per node, but point {name} has "
                f"trainer.devices: {trainer.get('devices', 'auto')} ({devices} per node in this job; "
                f"Lightning runs one DDP rank per SLURM task: set launcher.gpus_per_node/tasks_per_node "
                f"to {devices} or trainer.devices to {launcher.tasks})"
            )
        if num_nodes != launcher.nodes:
            raise ValueError(
                f"launcher.nodes: {launcher.nodes}, but point {name} has trainer.num_nodes: {num_nodes}"
            )


def job_devices(trainer: dict[str, Any], launcher: Launcher) -> int | None:
    """Devices per node that a trainer config asks for inside a job of ``launcher`` (None: cannot tell).

    ``auto`` (and ``-1``) mean every GPU the job gives a task (``gpus_per_node``) unless the accelerator is
    the CPU or the job has no GPU, then one process; a list or ``"0,1"`` counts its entries.
    """
    devices = trainer.get("devices", "auto")
    on_gpu = str(trainer.get("accelerator", "auto")) != "cpu" and launcher.gpus_per_node > 0
    if devices in ("auto", -1, "-1"):
        return launcher.gpus_per_node if on_gpu else 1
    if isinstance(devices, list | tuple):
        return len(devices)
    if isinstance(devices, str) and "," in devices:
        return len([d for d in devices.split(",") if d.strip()])
    try:
        return int(devices)
    except (TypeError, ValueError):
        return None


def make_executor(launcher: Launcher, folder: Path) -> submitit.AutoExecutor:
    """A submitit executor for ``launcher`` writing into ``folder`` (``%j`` sub-folders are not used: the
    logs of one sweep sit side by side as ``<job id>_0_log.out``)."""
    executor = submitit.AutoExecutor(folder=folder, cluster=launcher.executor)
    executor.update_parameters(
        name=launcher.name,
        timeout_min=launcher.timeout_min,
        nodes=launcher.nodes,
        gpus_per_node=launcher.gpus_per_node,
        tasks_per_node=launcher.tasks,
        cpus_per_task=launcher.cpus_per_task,
        mem_gb=launcher.mem_gb,
        slurm_partition=launcher.partition,
        slurm_array_parallelism=launcher.array_parallelism,
        slurm_additional_parameters=dict(launcher.slurm_args) or None,
        slurm_setup=list(launcher.setup) or None,
    )
    return executor


def job_rank() -> int:
    """This task's global rank inside a submitit job (0 in a one-task job)."""
    return submitit.JobEnvironment().global_rank


def write_job_record(folder: Path, job: submitit.Job, executor: str) -> None:
    """``folder/job.json``: the job that runs a point and where its logs are."""
    paths = job.paths
    record = {
        "executor": executor,
        "job_id": job.job_id,
        "folder": str(paths.folder),
        "stdout": str(paths.stdout),
        "stderr": str(paths.stderr),
        "submitted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    (folder / JOB_FILE).write_text(json.dumps(record, indent=2))


def read_job_record(folder: Path) -> dict[str, Any] | None:
    """The ``job.json`` of a point folder, if it has one."""
    path = folder / JOB_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def active_jobs(records: Sequence[dict[str, Any]]) -> set[str]:
    """The ids of the recorded jobs that may still be queued or running (and write into their point folders).

    SLURM jobs are asked through one ``sacct`` call for all of them (a state it cannot tell counts as
    ended); a local job of an earlier process counts as ended (submitit cannot follow it from another one).
    """
    jobs = [
        submitit.SlurmJob(folder=r["folder"], job_id=r["job_id"]) for r in records if r["executor"] == "slurm"
    ]  # all registered before the first state query, so that one sacct call answers for every job
    return {job.job_id for job in jobs if job.state.split(" ")[0] in ACTIVE_STATES}


def job_outcome(record: dict[str, Any]) -> str:
    """One line on why a submitted point has no result: the job's error, or that it has not ended."""
    paths = JobPaths(record["folder"], job_id=record["job_id"], task_id=0)
    if paths.result_pickle.is_file():
        outcome, payload = pickle_load(paths.result_pickle)
        if outcome == "error":  # payload: the formatted traceback; its last exception line says what failed
            raised = re.findall(
                r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b.*$", str(payload), re.M
            )
            return f"job {record['job_id']} failed ({raised[-1] if raised else 'see its log'}); log: {paths.stderr}"
        return f"job {record['job_id']} ended without writing a result; log: {paths.stderr}"
    return (
        f"job {record['job_id']} has not ended (queued or running) or was killed (time limit, memory, "
        f"cancelled); log: {record['stderr']}"
    )


def submit_points(
    launcher: Launcher,
    folder: Path,
    point_folders: Sequence[Path],
    run: Callable[..., Any],
    calls: Sequence[tuple[Any, ...]],
) -> list[submitit.Job]:
    """Submit ``run(*call)`` for every call as one job array (one job per call) and record each job in
    its point folder's ``job.json``."""
    executor = make_executor(launcher, folder)
    jobs = executor.map_array(run, *zip(*calls, strict=True))
    for point_folder, job in zip(point_folders, jobs, strict=True):
        point_folder.mkdir(parents=True, exist_ok=True)
        write_job_record(point_folder, job, launcher.executor)
    return jobs


def point_job(
    values: dict[str, Any],
    base: dict[str, Any],
    output: Path,
    eval_config: str | None,
    overhead_tokens: int,
    overhead_repeats: int,
    device: str | None,
) -> dict[str, Any] | None:
    """What one job of a launched sweep runs: :func:`run_point`, as this task's rank of the job."""
    return run_point(
        values, base, output, eval_config, overhead_tokens, overhead_repeats, device, rank=job_rank()
    )


def launch_points(
    launcher: Launcher,
    points: list[dict[str, Any]],
    base: dict[str, Any],
    output: Path,
    job_args: tuple[Any, ...],
) -> tuple[list[submitit.Job], str]:
    """Submit every point that has no result and no job still queued or running as one job array.

    ``job_args``: the arguments of :func:`point_job` after ``values``, ``base`` and ``output``. Returns
    the jobs and a line saying what was submitted, done and still in flight.
    """
    unfinished = [v for v in points if not (output / "points" / point_name(v) / RESULT_FILE).is_file()]
    records = {point_name(v): read_job_record(output / "points" / point_name(v)) for v in unfinished}
    running = active_jobs([r for r in records.values() if r is not None])
    todo, active = [], []
    for values in unfinished:
        record = records[point_name(values)]
        if record is not None and record["job_id"] in running:
            active.append(f"{point_name(values)} (job {record['job_id']})")
        else:
            todo.append(values)
    done = len(points) - len(unfinished)
    # the trainer each job will run (the folders do not matter here)
    fits = {point_name(v): point_config(base, fit_values(v), output, output) for v in todo}
    check_points_fit(launcher, fits)
    jobs_folder = Path(launcher.folder) if launcher.folder else output / JOBS_FOLDER
    jobs = []
    if todo:
        jobs = submit_points(
            launcher,
            jobs_folder,
            [output / "points" / point_name(v) for v in todo],
            point_job,
            [(v, base, output, *job_args) for v in todo],
        )
    if len(jobs) > 1:
        span = f"jobs {jobs[0].job_id} … {jobs[-1].job_id}"
    else:
        span = f"job {jobs[0].job_id}" if jobs else "no job"
    line = (
        f"lkv sweep: {len(points)} points: {len(todo)} submitted to {launcher.executor} ({span}, logs in "
        f"{jobs_folder}), {done} already done, {len(active)} still queued or running"
        + (f": {', '.join(active)}" if active else "")
    )
    return jobs, line
