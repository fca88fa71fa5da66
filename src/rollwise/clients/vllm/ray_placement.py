"""vLLM servers in Ray actors (`engine.vllm.placement: ray`): each server runs on whichever node Ray gives it.

The run still talks to the servers over HTTP (`engine.backend: remote`): Ray only places and owns them. Each
`VLLMServerHost` actor (a plain class; `ray.remote` and its resources are applied here, at launch) starts one
server as its own subprocess on its node, on a free port of that node, listening on all interfaces, and reports
`http://NODE_IP:PORT`. The server dies with its actor (PR_SET_PDEATHSIG), and the actor with the run (Ray kills
a driver's actors when the driver exits), so nothing outlives the run.

Deliberately left out: restarting a server whose actor died (the run fails with its last log line, as locally).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rollwise.clients.vllm.launch import VLLMLaunchError, VLLMLaunchSpec, VLLMServer, free_port


class VLLMServerHost:
    """One vLLM server on this actor's node."""

    def __init__(self, spec: VLLMLaunchSpec) -> None:
        import ray

        node_ip = ray.util.get_node_ip_address()
        port = free_port("0.0.0.0", spec.port)
        self.public = f"http://{node_ip}:{port}"
        self.server = VLLMServer(dataclasses.replace(spec, host="0.0.0.0", port=port))

    def start(self, timeout_s: float) -> float:
        self.server.start()
        self.server.spec = dataclasses.replace(self.server.spec, host="127.0.0.1")  # health from this node
        return self.server.wait_healthy(timeout_s)

    def url(self) -> str:
        return self.public

    def pid(self) -> int:
        return self.server.proc.pid if self.server.proc is not None else -1

    def alive(self) -> bool:
        return self.server.alive()

    def last_log_line(self) -> str:
        return self.server.last_log_line()

    def stop(self) -> None:
        self.server.stop()


class RayVLLMServers:
    """`VLLMServers`' calls (`urls`, `start`, `check_alive`, `stop`) over one actor per server."""

    def __init__(self, specs: list[VLLMLaunchSpec], *, address: str | None = None, gpus_per_server: float = 0,
                 cpus_per_server: float = 1, timeout_s: float = 600.0) -> None:
        import ray

        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, ignore_reinit_error=True, log_to_driver=False)
        self._ray = ray
        self.timeout_s = timeout_s
        need_gpus = gpus_per_server * len(specs)
        have = ray.cluster_resources()
        if need_gpus > have.get("GPU", 0) or cpus_per_server * len(specs) > have.get("CPU", 0):
            raise VLLMLaunchError(f"{len(specs)} vLLM server(s) need {need_gpus:g} GPU(s) and "
                                  f"{cpus_per_server * len(specs):g} CPU(s); the Ray cluster has {have.get('GPU', 0):g} "
                                  f"GPU(s) and {have.get('CPU', 0):g} CPU(s)")
        remote = ray.remote(max_restarts=0)(VLLMServerHost)
        # Ray types `.remote` only on `@ray.method`-decorated methods; this host class is plain (Ray is imported
        # only for this placement), so its handles are untyped here.
        self.actors: list[Any] = [remote.options(num_gpus=gpus_per_server, num_cpus=cpus_per_server).remote(s) for s in specs]
        self.urls: list[str] = []

    def _get(self, refs: Any, what: str) -> Any:
        try:
            return self._ray.get(refs, timeout=self.timeout_s)
        except self._ray.exceptions.GetTimeoutError:
            raise VLLMLaunchError(f"the vLLM server actors did not {what} within {self.timeout_s:.0f}s") from None
        except self._ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(getattr(e, "cause", None), Exception) else e
            raise VLLMLaunchError(str(cause).strip().splitlines()[-1][:300]) from None

    def start(self, timeout_s: float) -> list[float]:
        try:
            took = self._get([a.start.remote(timeout_s) for a in self.actors], "start")
            self.urls = self._get([a.url.remote() for a in self.actors], "report their URLs")
            return took
        except BaseException:
            self.stop()
            raise

    def check_alive(self) -> None:
        for a, ok in zip(self.actors, self._get([a.alive.remote() for a in self.actors], "answer")):
            if not ok:
                raise VLLMLaunchError(f"a vLLM server died: {self._get(a.last_log_line.remote(), 'answer')}")

    def stop(self) -> None:
        for a in self.actors:
            try:
                self._ray.get(a.stop.remote(), timeout=30)
            except Exception:  # noqa: BLE001 - a dead actor has nothing left to stop
                pass
            self._ray.kill(a)
        self.actors = []
