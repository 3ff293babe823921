"""A Harbor environment that runs a trial's commands on this host.

    harbor run ... --env arctic_host_env:HostEnvironment   # with examples/harbor on PYTHONPATH

Harbor 0.26 has no host environment (docker, podman and cloud sandboxes only). This one gives a
trial what a container would — its own `/logs`, `/tests`, `/solution`, `/tmp` and working
directory (`[environment].workdir`, default `/app`) — without one: at `start` it makes a
per-trial root directory, and a private mount namespace (`unshare --mount`, as root; otherwise
`unshare --user --map-root-user --mount`) whose root is that directory, with every other
top-level entry of the host's filesystem bind-mounted in. Each `exec` enters that namespace
(`nsenter`, `chroot`); the agent's tmux server lives there too (its socket is in the trial's
`/tmp`, so it never meets the host's tmux). Uploads and downloads copy to and from the trial's
root on the host side. `stop` kills every process left in the namespace and, with `delete`,
removes the root.

Not a sandbox: the trial reads and writes the host's filesystem outside its private
directories and shares the host's network, processes and users. For development and CI; use
Harbor's docker or cloud environments for untrusted agents. The task's Dockerfile is not built
(the host's tools are what the trial gets). Needs Linux, `unshare`, `nsenter`, `chroot` (util-
linux, coreutils) and, for terminus-2, `tmux`.

This module imports Harbor, so it runs in Harbor's own venv (Python >= 3.12) and is not part of
the project's packages: put `examples/harbor` on Harbor's `PYTHONPATH`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities

__all__ = ["HostEnvironment"]

PRIVATE = ("logs", "tests", "solution", "tmp")  # the trial's own, not the host's
DEFAULT_WORKDIR = "/app"
START_TIMEOUT_S = 30.0


class HostEnvironment(BaseEnvironment):
    """A trial's commands on this host, in a private mount namespace (module docstring)."""

    @staticmethod
    def type() -> str:
        return "arctic-host"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities()  # no GPUs, no network restriction, no host mounts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._root: Path | None = None
        self._holder: asyncio.subprocess.Process | None = None
        super().__init__(*args, **kwargs)

    # -- definition and lifecycle --------------------------------------------------------------

    def _validate_definition(self) -> None:
        if self.task_env_config.docker_image:
            self.logger.warning(
                "arctic-host does not run the task's docker_image; the host's tools are used"
            )
        for tool in ("unshare", "nsenter", "chroot"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"arctic-host needs `{tool}` on PATH (util-linux, coreutils)")
        w = PurePosixPath(self.workdir)
        top = w.parts[1] if len(w.parts) > 1 else ""
        if not w.is_absolute() or ".." in w.parts or not top:
            raise ValueError(
                f"arctic-host: [environment].workdir {self.workdir!r}: expected an absolute "
                "path below / without '..' (e.g. /app)"
            )
        if top not in PRIVATE and os.path.lexists(f"/{top}"):
            raise ValueError(
                f"arctic-host: [environment].workdir {self.workdir!r} is under the host's "
                f"/{top}, which the trial shares; choose a working directory whose first "
                "component the host does not have (e.g. /app): that one is the trial's own"
            )

    @property
    def workdir(self) -> str:
        return self.task_env_config.workdir or DEFAULT_WORKDIR

    def _private_tops(self) -> set[str]:
        return {*PRIVATE, PurePosixPath(self.workdir).parts[1]}

    async def start(self, force_build: bool) -> None:
        root = Path(tempfile.mkdtemp(prefix=f"arctic-host-{self.session_id[:40]}-"))
        self._root = root
        root.chmod(0o755)  # the trial's `/`: mkdtemp's 0700 would shut out every other user
        for d in ("logs/agent", "logs/verifier", "logs/artifacts", "tests", "solution", "tmp"):
            (root / d).mkdir(parents=True, exist_ok=True)
        (root / "tmp").chmod(0o1777)
        (root / self.workdir.lstrip("/")).mkdir(parents=True, exist_ok=True)
        private = self._private_tops()
        lines = ["set -e"]
        for entry in sorted(os.listdir("/")):
            if entry in private:
                continue
            src, dst = Path("/") / entry, root / entry
            if src.is_symlink():  # e.g. bin -> usr/bin
                dst.symlink_to(os.readlink(src))
            elif src.is_dir():
                dst.mkdir(exist_ok=True)
                lines.append(f"mount --rbind {shlex.quote(str(src))} {shlex.quote(str(dst))}")
            # plain files at / (rare) stay the host's only
        lines.append("echo ready; exec sleep infinity")
        unshare = ["unshare", "--mount", "--propagation", "private"]
        if os.geteuid() != 0:
            unshare[1:1] = ["--user", "--map-root-user"]
        self._holder = await asyncio.create_subprocess_exec(
            *unshare,
            "bash",
            "-c",
            "\n".join(lines),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        assert self._holder.stdout is not None
        try:
            ready = await asyncio.wait_for(self._holder.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if ready.strip() != b"ready":
            err = b""
            if self._holder.stderr is not None:
                with contextlib.suppress(TimeoutError):
                    err = await asyncio.wait_for(self._holder.stderr.read(), 5)
            await self.stop(delete=True)
            raise RuntimeError(
                "arctic-host could not make the trial's mount namespace "
                f"({' '.join(unshare)}): {err.decode(errors='replace').strip()}"
            )
        await self._upload_environment_dir_after_start()

    def _namespace_pids(self) -> list[int]:
        """Every process in the trial's mount namespace (the holder, tmux, what the agent ran)."""
        if self._holder is None:
            return []
        try:
            ns = os.readlink(f"/proc/{self._holder.pid}/ns/mnt")
        except OSError:
            return []
        out = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/ns/mnt") == ns:
                        out.append(int(pid))
        return out

    async def stop(self, delete: bool) -> None:
        for pid in self._namespace_pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self._holder is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._holder.wait(), 10)
            self._holder = None
        if delete and self._root is not None:
            # the bind mounts lived only in the namespace: here they are empty directories
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    # -- commands ------------------------------------------------------------------------------

    def _user_prefix(self, user: str | int | None) -> list[str]:
        """Run as `user` (a name or a uid; the current user when None): `runuser` by name,
        `setpriv` by uid (both util-linux; only root may switch)."""
        user = user if user is not None else self.default_user
        if user is None or str(user) in ("root", "0"):
            return []
        if str(user).isdigit():
            return ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", "--"]
        return ["runuser", "-u", str(user), "--"]

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        if self._holder is None or self._root is None:
            raise RuntimeError("arctic-host: exec before start (or after stop)")
        merged = {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "HOME": os.environ.get("HOME", "/root"),
            "LANG": os.environ.get("LANG", "C.UTF-8"),
            "TERM": "xterm-256color",
            "TMPDIR": "/tmp",
            **(self._merge_env(env) or {}),
        }
        args = ["nsenter", "-t", str(self._holder.pid), "-m"]
        if os.geteuid() != 0:
            args[3:3] = ["-U", "--preserve-credentials"]
        args += ["chroot", str(self._root), *self._user_prefix(user), "env", "-i"]
        args += [f"{k}={v}" for k, v in merged.items()]
        script = f"cd {shlex.quote(cwd or self.workdir)} && {command}"
        # Output goes to files, not pipes: a process the command leaves in the background
        # (it lives on in the trial until `stop`) would hold a pipe open, and the call with it.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = await asyncio.create_subprocess_exec(
                *args,
                "bash",
                "-c",
                script,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                await asyncio.wait_for(proc.wait(), timeout_sec or None)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()
                raise RuntimeError(f"Command timed out after {timeout_sec} seconds") from None
            texts = []
            for f in (out, err):
                f.seek(0)
                texts.append(f.read().decode(errors="replace") or None)
        return ExecResult(stdout=texts[0], stderr=texts[1], return_code=proc.returncode or 0)

    # -- files: the trial's paths, seen from the host ------------------------------------------

    def _host_path(self, path: str | PurePosixPath) -> Path:
        """Where a trial path is on the host: under the trial's root for its private
        directories, the host's own path for everything else (bind-mounted in the namespace)."""
        if self._root is None:
            raise RuntimeError("arctic-host: file transfer before start (or after stop)")
        p = PurePosixPath(path)
        if not p.is_absolute():
            p = PurePosixPath(self.workdir) / p
        if ".." in p.parts:
            raise ValueError(f"arctic-host: a trial path may not contain '..': {str(path)!r}")
        if len(p.parts) > 1 and p.parts[1] in self._private_tops():
            return self._root / Path(*p.parts[1:])
        return Path(p)

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        dst = self._host_path(target_path)
        dst.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, source_path, dst)

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        dst = self._host_path(target_dir)
        await asyncio.to_thread(shutil.copytree, source_dir, dst, dirs_exist_ok=True)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        Path(target_path).parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(shutil.copy2, self._host_path(source_path), target_path)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        await asyncio.to_thread(
            shutil.copytree, self._host_path(source_dir), target_dir, dirs_exist_ok=True
        )
