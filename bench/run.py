"""`make bench`: the SPEC §9 figures, each beside its target (and its baseline, measured in the same run)."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import asynccontextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ias.registry import load_registry  # noqa: E402
from ias.store import POOL_IDLE_CLOSE  # noqa: E402

RESULTS: list[tuple[str, bool]] = []


def report(line: str, ok: bool) -> None:
    RESULTS.append((line, ok))
    print(f"{'PASS' if ok else 'MISS'}  {line}", flush=True)


def bench_registry() -> None:
    """1,000 skills: parse + schema check."""
    template = (REPO / "resources/skills/get_current_datetime/SKILL.md").read_text(encoding="utf-8")
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(1000):
            d = Path(tmp) / f"skill_{i:04d}"
            d.mkdir()
            (d / "SKILL.md").write_text(template, encoding="utf-8")
        times = []
        for _ in range(5):
            start = time.perf_counter()
            reg = load_registry(None, Path(tmp))
            times.append(time.perf_counter() - start)
        assert len(reg) == 1000, reg.problems[:3]
    best = min(times) * 1000
    report(f"registry: 1,000 skills load in {best:.0f} ms (median {statistics.median(times) * 1000:.0f} ms; "
           f"target <= 200 ms)", best <= 200)


def bench_validator() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    import schema_bench
    figures = schema_bench.main()
    worst = figures["worst_pattern"]
    report(f"pattern: slowest accepted pattern {worst['pattern']!r} takes {worst['ms']:.1f} ms against "
           f"{worst['input']} (target <= 50 ms)", worst["ms"] <= 50)
    ratio = figures.get("ratio")
    if ratio is None:
        report("validator: jsonschema not installed here; ratio not measured (bench only)", True)
    else:
        report(f"validator: {ratio:.1f}x jsonschema's throughput (target >= 10x)", ratio >= 10)


def bench_cold_start() -> None:
    """`python ias.py skills`, wall time, best and median of 7."""
    times = []
    for _ in range(7):
        start = time.perf_counter()
        subprocess.run([sys.executable, str(REPO / "ias.py"), "skills"], check=True, capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(7):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    bare = (time.perf_counter() - start) / 7 * 1000
    median = statistics.median(times) * 1000
    report(f"skills cold start: {median:.0f} ms median, {min(times) * 1000:.0f} ms best "
           f"(bare interpreter {bare:.0f} ms; target <= 300 ms)", median <= 300)


@asynccontextmanager
async def _bench_app(fixture: str):
    """`app.build` over a fresh schema and data directory, with the skills of tests/fixtures/<fixture>;
    yields (app, data directory); everything removed afterwards."""
    from tests.support import drop_schema, fresh_schema_dsn
    from ias.app import build
    from ias.auditchain import AuditChain
    from ias.config import Config
    from ias.store import Store

    dsn, schema_name = await asyncio.to_thread(fresh_schema_dsn)
    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-"))
    skills = Path(tempfile.mkdtemp(prefix="ias-bench-skills-")) / fixture
    shutil.copytree(REPO / "tests" / "fixtures" / fixture, skills)     # links made files: a sandbox sees its dir only
    config = Config(data_dir=tmp, system_skills_dir=None, skills_dir=skills,
                    approval_timeout=60, environ={"PATH": os.environ.get("PATH", "")})
    key = os.urandom(32)
    store = await Store.open(dsn, chain=AuditChain.derive(key, config.audit_head))
    try:
        app = build(config, store, key=key)
        try:
            yield app, tmp
        finally:
            await app.mcp.close()
    finally:
        await store.close()
        await asyncio.to_thread(drop_schema, schema_name)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(skills.parent, ignore_errors=True)


async def bench_gate() -> None:
    """Runner overhead (Low call through the gate vs bare bash -c), approval latency, a granted call's overhead."""
    from dataclasses import replace
    from ias.sandbox import Policy
    from tests.support import FakeOwner, granted

    async with _bench_app("gate") as (app, tmp):
        registry, runner, approvals, gate = app.registry, app.runner, app.approvals, app.gate
        script = registry.get("echo_low").execute
        rounds = 60
        # The same skill outside the sandbox (bench only: `- unconfined` is refused on a Low skill), for the
        # gate's own overhead and for what the sandbox adds.
        registry.skills["echo_open"] = replace(registry.get("echo_low"), name="echo_open",
                                               sandbox=Policy(unconfined=True))

        async def bare() -> None:
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", script, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                cwd=registry.get("echo_low").directory, env={"PATH": os.environ.get("PATH", ""), "IAS_PARAM_TEXT": "hi"},
                start_new_session=True)
            await proc.communicate(b'{"text": "hi"}')

        async def through_gate() -> None:
            result = await gate.call("bench", "echo_open", {"text": "hi"})
            assert result == {"success": True, "output": "hi"}, result

        async def sandboxed() -> None:
            result = await gate.call("bench", "echo_low", {"text": "hi"})
            assert result == {"success": True, "output": "hi"}, result

        for fn in (bare, through_gate, sandboxed):        # warm-up
            for _ in range(5):
                await fn()
        bare_t, gate_t, boxed_t = [], [], []
        for _ in range(rounds):              # interleaved so all see the same machine load
            for fn, sink in ((bare, bare_t), (through_gate, gate_t), (sandboxed, boxed_t)):
                start = time.perf_counter()
                await fn()
                sink.append(time.perf_counter() - start)
        b, g, s = (statistics.median(t) * 1000 for t in (bare_t, gate_t, boxed_t))
        limit = 1.5 * b + 5
        report(f"runner overhead: gate call {g:.1f} ms vs bare bash -c {b:.1f} ms = {g / b:.2f}x "
               f"(unsandboxed, the sandbox is the next figure; target <= 1.5x + 5 ms = {limit:.1f} ms)", g <= limit)
        report(f"sandbox: sandboxed Low call {s:.1f} ms vs the same call unsandboxed {g:.1f} ms = +{s - g:.1f} ms "
               f"(median of {rounds}, level {runner.sandbox.level()}; target <= +15 ms)", s - g <= 15)

        started: list[float] = []
        original = runner.execute

        async def timed_execute(skill, params, **kw):
            result = await original(skill, params, **kw)
            started.append(result.started_at)
            return result
        runner.execute = timed_execute
        latencies = []
        marker = granted("bench-mark")       # where mark_high's ## Sandbox lets it write
        for i in range(15):
            owner = FakeOwner()
            task = asyncio.create_task(gate.call("bench", "mark_high", {"marker": str(marker)}, owner.notify))
            code = await owner.code()
            received = time.monotonic()
            await approvals.redeem("bench", code)
            await task
            latencies.append(started[-1] - received)
        lat = statistics.median(latencies) * 1000
        report(f"approval latency: reply received -> skill started {lat:.1f} ms median, "
               f"{max(latencies) * 1000:.1f} ms max (target <= 50 ms)", lat <= 50)

        # A granted High call against the same script run as a Low skill: what finding and using the grant costs.
        owner, params = FakeOwner(), {"marker": str(marker), "note": "granted"}
        task = asyncio.create_task(gate.call("bench", "mark_high", params, owner.notify))
        await approvals.redeem("bench", await owner.code() + "+1d")
        await task
        registry.skills["mark_low"] = replace(registry.get("mark_high"), name="mark_low", risk="low")

        async def never_asked(text: str) -> bool:
            return False                    # a call that asks is not granted: it fails the assertion below

        low_t, granted_t = [], []
        for _ in range(rounds):
            for name, sink in (("mark_low", low_t), ("mark_high", granted_t)):
                start = time.perf_counter()
                result = await gate.call("bench", name, params, never_asked)
                sink.append(time.perf_counter() - start)
                assert result["success"], result
        low, grant = (statistics.median(t) * 1000 for t in (low_t, granted_t))
        report(f"grants: granted High call {grant:.1f} ms vs the same script as a Low call {low:.1f} ms = "
               f"+{grant - low:.1f} ms (median of {rounds}; target <= +5 ms)", grant - low <= 5)


async def bench_mcp() -> None:
    """A call through the gate to a warm MCP server vs a direct JSON-RPC round trip to the same server."""
    async with _bench_app("mcp") as (app, _):
        await app.mcp.check("demo")
        conn = await app.mcp.connection("demo")        # the same warm server both ways
        args = {"name": "echo", "arguments": {"text": "hi"}}

        async def direct() -> None:
            result = await conn.request("tools/call", args, 10)
            assert result["content"][0]["text"] == "hi", result

        async def through_gate() -> None:
            result = await app.gate.call("bench", "demo__echo", {"text": "hi"})
            assert result == {"success": True, "output": "hi"}, result

        for fn in (direct, through_gate):
            for _ in range(10):
                await fn()
        direct_t, gate_t = [], []
        for _ in range(100):             # interleaved so both see the same machine load
            for fn, sink in ((direct, direct_t), (through_gate, gate_t)):
                start = time.perf_counter()
                await fn()
                sink.append(time.perf_counter() - start)
        d, g = statistics.median(direct_t) * 1000, statistics.median(gate_t) * 1000
        report(f"mcp: gate call to a warm server {g:.2f} ms vs direct JSON-RPC round trip {d:.2f} ms "
               f"= +{g - d:.2f} ms (target <= +5 ms)", g - d <= 5)


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _cluster_pids(datadir: Path) -> list[int]:
    """The embedded cluster's postmaster (from postmaster.pid) and its children."""
    postmaster = int((datadir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(entry.name))
            except (OSError, ValueError):
                continue
    return [postmaster, *children]


def _idle_daemon(env: dict, tmp: Path, count=lambda: 0, tree=lambda pid: [pid],
                 warm=None) -> tuple[float, float, int, list]:
    """Start the daemon, wait for READY (and for `warm(proc)`, e.g. one turn), then measure its RSS,
    `count()`, and the CPU seconds and PSS of each of `tree(pid)` (the daemon alone by default,
    first) over 10 idle seconds."""
    import signal
    import socket
    sock_path = str(tmp / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(sock_path)
        listener.settimeout(60)
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py")], env={**env, "NOTIFY_SOCKET": sock_path},
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp)
        try:
            listener.recv(64)                          # READY=1
            if warm is not None:
                warm(proc)
            time.sleep(POOL_IDLE_CLOSE + 1)            # idle: the pool has closed its unused connections
            pids = tree(proc.pid)
            cpu0, n0 = sum(map(_cpu_seconds, pids)), count()
            time.sleep(10)
            cpu = sum(map(_cpu_seconds, pids)) - cpu0
            return _rss_mb(proc.pid), cpu, count() - n0, [_pss_mb(pid) for pid in pids]
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
            os.unlink(sock_path)


def bench_footprint() -> None:
    """The idle daemon as the README starts it (default settings: embedded cluster in ./var, console
    channel, an API key set) together with every process of its cluster: PSS and CPU, right after
    start and again after one conversation turn (which loads the openai SDK)."""
    from tests.servers.llm import LLMServer, text
    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-"))
    os.chmod(tmp, 0o755)                          # as root, the cluster runs as `postgres`
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_", "PG"))}

    def tree(pid: int) -> list[int]:
        return [pid, *_cluster_pids(tmp / "var" / "pg")]
    try:
        with LLMServer([text("好的")], repeat_last=True) as server:
            env.update({"OPENAI_API_KEY": "sk-test", "OPENAI_BASE_URL": server.base_url})
            subprocess.run([sys.executable, str(REPO / "ias.py"), "audit", "--limit", "1"], env=env, check=True,
                           capture_output=True, cwd=tmp)            # initdb and schema done, server stopped again

            def one_turn(proc: subprocess.Popen) -> None:
                asked = len(server.requests)
                proc.stdin.write("你好\n".encode())
                proc.stdin.flush()
                deadline = time.monotonic() + 30
                while len(server.requests) == asked and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1)                                         # the reply goes out, the turn ends
            for label, warm in (("after start", None), ("after one turn", one_turn)):
                _, cpu, _, pss = _idle_daemon(env, tmp, tree=tree, warm=warm)
                report(f"idle footprint {label}: daemon + embedded cluster {sum(pss):.1f} MB PSS in {len(pss)} "
                       f"processes (daemon {pss[0]:.0f} MB, cluster {sum(pss[1:]):.0f} MB), {cpu:.3f} s CPU in "
                       f"10 s (targets <= 70 MB, <= 0.02 s)", sum(pss) <= 70 and cpu <= 0.02)
    finally:
        _stop_lingering(tmp / "var" / "pg")
        shutil.rmtree(tmp, ignore_errors=True)


# The stand-in for llm 0.36 (issue 28): a bare `openai` client script that sends the same request and writes the
# answer to SQLite, as llm logs each exchange.
BARE_CLIENT = """
import os, sqlite3, sys, openai
client = openai.OpenAI(max_retries=0)
reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": sys.argv[1]}])
db = sqlite3.connect(sys.argv[2])
db.execute("CREATE TABLE IF NOT EXISTS log (prompt TEXT, answer TEXT)")
db.execute("INSERT INTO log VALUES (?, ?)", (sys.argv[1], reply.choices[0].message.content))
db.commit()
print(reply.choices[0].message.content)
os._exit(0)
"""


def _stop_lingering(cluster_dir: Path) -> None:
    """Stop an embedded server left lingering after its last user (as its reaper would, now): a bench must not
    leave one running on a directory it is about to remove."""
    from ias.pgcluster import Cluster
    cluster = Cluster(cluster_dir)
    if cluster.idle_file.exists():
        cluster.reap(cluster.idle_file.read_text(encoding="ascii").strip())


ONCE_ROUNDS = 11         # a 2-core machine's noise is ~±10 % per run: medians of this many


def bench_once() -> None:
    """`ias --once` as a script runs it under default settings (the embedded cluster, initialised; each run finds
    it lingering after the last), interleaved with the bare openai + SQLite client against the same endpoint:
    wall time and peak memory, plain and with one Low tool call."""
    from tests.servers.llm import LLMServer, calls, text
    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-once-"))
    os.chmod(tmp, 0o755)                          # as root, the cluster runs as `postgres`
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_", "PG"))}
    env.update({"IAS_DATA_DIR": str(tmp / "var"), "OPENAI_API_KEY": "sk-test"})
    try:
        with LLMServer([text("ok")], repeat_last=True) as server:
            env["OPENAI_BASE_URL"] = server.base_url
            _measured([sys.executable, str(REPO / "ias.py"), "--once", "hi"], env, tmp)  # initdb, schema, caches
            bare_argv = [sys.executable, "-c", BARE_CLIENT, "现在几点", str(tmp / "bare.db")]
            _measured(bare_argv, env, tmp)

            def once(*steps) -> tuple[float, float]:
                server.script(*steps)
                wall, peak, done = _measured([sys.executable, str(REPO / "ias.py"), "--once", "现在几点"], env, tmp)
                assert done.returncode == 0, done.stderr
                return wall, peak

            def bare() -> tuple[float, float]:
                server.script(text("现在是九点。"))
                wall, peak, done = _measured(bare_argv, env, tmp)
                assert done.returncode == 0, done.stderr
                return wall, peak
            plain, baseline, tool = [], [], []
            for _ in range(ONCE_ROUNDS):          # interleaved so that all see the same machine load
                plain.append(once(text("现在是九点。")))
                baseline.append(bare())
                tool.append(once(calls(("get_current_datetime", {})), text("九点。")))
        wall, base = (statistics.median(t for t, _ in runs) for runs in (plain, baseline))
        peak = max(m for _, m in plain)
        report(f"--once plain answer: {wall * 1000:.0f} ms wall, {peak:.0f} MB peak; the bare openai + SQLite client "
               f"{base * 1000:.0f} ms = iAs {base / wall:.2f}x as fast (medians of {ONCE_ROUNDS}, interleaved, embedded cluster; "
               f"targets <= 650 ms, >= 1.15x, <= 70 MB)", wall <= 0.65 and base / wall >= 1.15 and peak <= 70)
        wall = statistics.median(t for t, _ in tool)
        report(f"--once with one Low tool call: {wall * 1000:.0f} ms wall (target <= 750 ms)", wall <= 0.75)
    finally:
        _stop_lingering(tmp / "var" / "pg")
        shutil.rmtree(tmp, ignore_errors=True)


def bench_agent() -> None:
    """Request size and the daemon at idle, against a local endpoint."""
    import json
    from tests.servers.llm import LLMServer, text
    from tests.support import drop_schema, fresh_schema_dsn

    dsn, schema_name = fresh_schema_dsn()
    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "IAS_", "NOTIFY_"))}
    env.update({"IAS_DATABASE_URL": dsn, "IAS_DATA_DIR": str(tmp), "OPENAI_API_KEY": "sk-test"})
    try:
        with LLMServer([text("ok")]) as server:
            env["OPENAI_BASE_URL"] = server.base_url

            def once(*steps) -> None:
                server.script(*steps)
                subprocess.run([sys.executable, str(REPO / "ias.py"), "--once", "现在几点"], env=env, check=True,
                               capture_output=True, cwd=tmp)
            subprocess.run([sys.executable, str(REPO / "ias.py"), "--once", "/reset"], env=env, check=True,
                           capture_output=True, cwd=tmp)
            once(text("现在是九点。"))
            once(text("好的。"))
            first, second = len(server.raw[-2]), len(server.raw[-1])
            tools = len(json.loads(server.raw[-1])["tools"])
            report(f"request size: {first:,} bytes with all {tools} skills as tools and no history, {second:,} bytes "
                   f"with a one-exchange history (target <= 8 KB)", second <= 8192)

        rss, cpu, _, _ = _idle_daemon(env, tmp)
        report(f"daemon idle (console): {rss:.0f} MB RSS, {cpu:.3f} s CPU in 10 s (targets <= 80 MB, <= 0.02 s)",
               rss <= 80 and cpu <= 0.02)
        from tests.servers.ilink import ILinkServer
        with ILinkServer(hold=35) as ilink:
            rss, cpu, polls, _ = _idle_daemon({**env, "IAS_WECHAT_TOKEN": ilink.token, "IAS_WECHAT_OWNER": ilink.owner,
                                               "IAS_WECHAT_BASE_URL": ilink.base_url}, tmp,
                                              lambda: len(ilink.calls("/ilink/bot/getupdates")))
        report(f"daemon idle on the WeChat long poll: {rss:.0f} MB RSS, {cpu:.3f} s CPU and {polls} getupdates "
               f"requests in 10 s (targets <= 80 MB, <= 0.02 s, no busy loop)", rss <= 80 and cpu <= 0.02 and polls <= 2)
    finally:
        drop_schema(schema_name)
        shutil.rmtree(tmp, ignore_errors=True)


def bench_scale() -> None:
    """1,000 generated user skills: request size, tool count and hit rate over the 200 labelled requests,
    through the real agent and client against the local endpoint (refusing > 128 tools); and `ias skills`
    with 5,000 skills (the first listing parses and caches, later ones read the cache)."""
    from tests import skillset
    from tests.servers.llm import LLMServer, text
    from tests.support import drop_schema, fresh_schema_dsn
    from ias.app import build
    from ias.auditchain import AuditChain
    from ias.config import Config
    from ias.llm import LLM
    from ias.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-scale-"))
    dsn, schema_name = fresh_schema_dsn()
    try:
        skillset.write(tmp / "skills")
        labelled = skillset.requests()

        async def turns() -> list[bytes]:
            config = Config(data_dir=tmp / "data", skills_dir=tmp / "skills", environ={})
            config.data_dir.mkdir()
            store = await Store.open(dsn, chain=AuditChain.derive(b"k" * 32, config.audit_head))
            with LLMServer([text("好的。")], repeat_last=True, max_tools=128) as server:
                llm = LLM("sk-test", server.base_url, "test-model", retry_delays=(0.01,))
                try:
                    app = build(config, store, key=b"k" * 32, llm=llm)
                    for i, (message, _) in enumerate(labelled):
                        await app.agent.turn(f"user{i}", message, None)     # a fresh conversation each
                    assert server.refused == 0
                    return list(server.raw)
                finally:
                    await llm.close()
                    await store.close()
        raw = asyncio.run(turns())
        sizes = [len(r) for r in raw]
        offered = [{t["function"]["name"] for t in json.loads(r)["tools"]} for r in raw]
        hits = sum(wanted in names for (_, wanted), names in zip(labelled, offered))
        most = max(len(names) for names in offered)
        report(f"1,000 user skills: requests {statistics.median(sizes):,.0f} bytes median, {max(sizes):,} max, "
               f"<= {most} tools (all 1,008 as tools would be ~{_all_tools_bytes(tmp / 'skills'):,} bytes; "
               f"targets <= 16 KB, <= 128 tools)", max(sizes) <= 16384 and most <= 128)
        report(f"tool selection: the right skill offered for {hits} of {len(labelled)} labelled requests "
               f"({hits / len(labelled):.1%}; target >= 95%)", hits / len(labelled) >= 0.95)

        many = tmp / "many"
        template = (REPO / "resources/skills/get_current_datetime/SKILL.md").read_text(encoding="utf-8")
        for i in range(5000):
            (many / f"skill_{i:04d}").mkdir(parents=True)
            (many / f"skill_{i:04d}" / "SKILL.md").write_text(template, encoding="utf-8")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("IAS_")},
               "IAS_SKILLS_DIR": str(many), "IAS_DATA_DIR": str(tmp / "data5k")}

        def listing() -> float:
            start = time.perf_counter()
            subprocess.run([sys.executable, str(REPO / "ias.py"), "skills"], env=env, check=True, capture_output=True)
            return time.perf_counter() - start
        first = listing()
        cached = statistics.median(listing() for _ in range(5))
        fresh = []
        for _ in range(3):                # a fresh data directory each time: no spec cache
            shutil.rmtree(tmp / "data5k", ignore_errors=True)
            fresh.append(listing())
        first = statistics.median(fresh)
        report(f"skills with 5,000 skills: {first * 1000:.0f} ms median on a fresh data directory (parses all and "
               f"writes the spec cache), {cached * 1000:.0f} ms from the cache (target <= 500 ms either way)",
               first <= 0.5 and cached <= 0.5)
    finally:
        drop_schema(schema_name)
        shutil.rmtree(tmp, ignore_errors=True)


AUDIT_ROWS = int(os.environ.get("IAS_BENCH_AUDIT_ROWS", 1_000_000))         # rows of the audit log the retention figures are measured over


def fill_audit(dsn: str, chain, rows: int) -> None:
    """`rows` keyed audit rows appended to the log of `dsn`, chained in Python and COPYed in (a turn's
    worth of a call each: started, then finished with its exit code), and the head recorded."""
    from datetime import datetime, timedelta, timezone
    import psycopg
    from ias.auditchain import Head, advance, seal
    from ias.store import ChainRow
    columns = [f.name for f in ChainRow.__dataclass_fields__.values() if f.name != "digest"]
    start = datetime.now(timezone.utc) - timedelta(days=400)
    with psycopg.connect(dsn, autocommit=True) as conn:
        [(first, previous)] = conn.execute("SELECT coalesce(max(id), 0) + 1, coalesce((SELECT hash FROM audit_log "
                                           "ORDER BY id DESC LIMIT 1), '') FROM audit_log").fetchall()
        with conn.transaction(), conn.cursor().copy(f"COPY audit_log ({', '.join(columns)}) FROM STDIN") as copy:
            for row_id in range(first, first + rows):
                finished = row_id % 2 == 0
                row = ChainRow(row_id, start + timedelta(milliseconds=30 * row_id),
                               "skill_finished" if finished else "skill_started", "owner", "query_weather",
                               '{"city": "北京", "days": 3}', "low", None, None, 0 if finished else None,
                               120 if finished else None, 2048 if finished else None, False if finished else None,
                               f"call={(row_id + 1) // 2:032x} pid=1 start=1", previous, "")
                previous = seal(chain.key, row)
                copy.write_row([*(getattr(row, name) for name in columns[:-1]), previous])
        conn.execute("SELECT setval(pg_get_serial_sequence('audit_log', 'id'), %s)", (first + rows - 1,))
    advance(chain.head, Head(first + rows - 1, previous))


def _measured(argv: list[str], env: dict, cwd: Path) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run a command: its wall time (s), its peak RSS (MB: the sum of the peaks (VmHWM) of its process and
    its helper processes, sampled every 10 ms; not wait4's ru_maxrss, which counts the bench's own pages
    the child shared before its exec) and what it printed."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak[0] = max(peak[0], _tree_rss(proc.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, err = proc.stdout.read(), proc.stderr.read()           # a few lines each
    done.set()
    sampler.join()
    _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stdout.close()
    proc.stderr.close()
    return (time.perf_counter() - start, peak[0] / 1024,
            subprocess.CompletedProcess(argv, proc.returncode, out, err))


def _tree_rss(pid: int, parent: bytes | None = None) -> int:
    """KB: the peak resident size of `pid` and of each of its descendants so far, summed (0 for what has gone)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if cmdline == (parent if parent is not None else Path("/proc/self/cmdline").read_bytes()):
            return 0                # forked, not yet exec'd: it still shares its parent's memory (counted there)
        status = Path(f"/proc/{pid}/status").read_text()
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return 0
    own = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), 0)
    return own + sum(_tree_rss(int(child), cmdline) for child in children)


def _ready_seconds(env: dict, cwd: Path) -> float:
    """Seconds from spawning the daemon to its READY=1 (then it is stopped)."""
    import signal
    import socket
    sock_path = str(cwd / "notify.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as listener:
        listener.bind(sock_path)
        listener.settimeout(120)
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(REPO / "ias.py")], env={**env, "NOTIFY_SOCKET": sock_path},
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=cwd)
        try:
            listener.recv(64)
            return time.perf_counter() - start
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            os.unlink(sock_path)


def bench_retention() -> None:
    """1 M keyed audit rows: `ias audit --verify` (wall time, peak RSS), daemon start against an empty
    log (the baseline) and against this one, and `ias audit --prune-before` of the older half."""
    from tests.support import drop_schema, fresh_schema_dsn
    from ias.approval import load_key
    from ias.auditchain import AuditChain
    from ias.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-retention-"))
    schemas = [fresh_schema_dsn(), fresh_schema_dsn()]
    try:
        envs = []
        for i, (dsn, _) in enumerate(schemas):
            data = tmp / f"data{i}"
            chain = AuditChain.derive(load_key(data / "secret.key"), data / "audit.head")
            asyncio.run(_opened_and_closed(Store, dsn, chain))
            envs.append((chain, {**{k: v for k, v in os.environ.items() if not k.startswith(("IAS_", "OPENAI_"))},
                                 "IAS_DATABASE_URL": dsn, "IAS_DATA_DIR": str(data),
                                 "IAS_SKILLS_DIR": str(REPO / "tests" / "fixtures" / "gate")}))
        (_, empty_env), (chain, env) = envs
        start = time.perf_counter()
        fill_audit(schemas[1][0], chain, AUDIT_ROWS)
        print(f"      ({AUDIT_ROWS:,} keyed audit rows written in {time.perf_counter() - start:.1f} s)", flush=True)
        import psycopg
        with psycopg.connect(schemas[1][0], autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE audit_log")
        ias = [sys.executable, str(REPO / "ias.py")]
        _measured([*ias, "audit", "--verify"], env, tmp)                    # the table read once into the cache
        wall, rss, verify = _measured([*ias, "audit", "--verify"], env, tmp)
        base_wall, base_rss, _ = _measured([*ias, "audit", "--limit", "1"], env, tmp)
        report(f"audit --verify over {AUDIT_ROWS:,} rows: {wall:.2f} s, peak RSS {rss:.0f} MB "
               f"(`audit --limit 1`: {base_wall:.2f} s, {base_rss:.0f} MB; {verify.stdout.strip() or verify.stderr.strip()}; "
               f"targets <= 5 s, <= 100 MB)", verify.returncode == 0 and wall <= 5 and rss <= 100)
        empty = min(_ready_seconds(empty_env, tmp) for _ in range(3))
        full = min(_ready_seconds(env, tmp) for _ in range(3))
        report(f"daemon start with {AUDIT_ROWS:,} audit rows: {full:.2f} s to READY (with none: {empty:.2f} s; "
               f"target within 0.2 s of it)", full - empty <= 0.2)
        from datetime import datetime, timedelta, timezone
        half = (datetime.now(timezone.utc) - timedelta(days=400) + timedelta(milliseconds=30 * AUDIT_ROWS // 2)).isoformat()
        wall, _, pruned = _measured([*ias, "audit", "--prune-before", half], env, tmp)
        after, _, verify = _measured([*ias, "audit", "--verify"], env, tmp)
        report(f"audit --prune-before (the older half): {wall:.1f} s, then --verify {after:.2f} s "
               f"({verify.stdout.strip() or verify.stderr.strip()})", pruned.returncode == 0 and verify.returncode == 0)
    finally:
        for _, name in schemas:
            drop_schema(name)
        shutil.rmtree(tmp, ignore_errors=True)


async def _opened_and_closed(store_class, dsn: str, chain) -> None:
    """The schema built (and the store closed again)."""
    store = await store_class.open(dsn, chain=chain)
    await store.close()


async def bench_media() -> None:
    """An inbound 5 MB WeChat image, from the message on the local iLink server to the model's request: the
    long poll, the CDN download over loopback, AES decryption, the inbox write, the router and the agent's
    image part (IAS_VISION=1)."""
    from tests.servers.ilink import ILinkServer
    from tests.support import ScriptedLLM, answer, drop_schema, fresh_schema_dsn
    from ias.app import build, wechat
    from ias.auditchain import AuditChain
    from ias.channels.wechat.cdn import encrypt
    from ias.config import Config
    from ias.store import Store
    from ias.supervisor import Supervisor

    dsn, schema_name = await asyncio.to_thread(fresh_schema_dsn)
    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-media-"))
    server = ILinkServer(hold=5.0).start()
    config = Config(data_dir=tmp, system_skills_dir=None, skills_dir=REPO / "tests" / "fixtures" / "gate", vision=1,
                    environ={"PATH": os.environ.get("PATH", "")}, wechat_token=server.token,
                    wechat_owner=server.owner, wechat_base_url=server.base_url, wechat_cdn_url=server.cdn_url)
    key = os.urandom(32)
    store = await Store.open(dsn, chain=AuditChain.derive(key, config.audit_head))
    model = ScriptedLLM(answer("好。"), repeat_last=True)
    asked: list[float] = []
    original = model.complete

    async def timed(messages, tools):
        asked.append(time.perf_counter())
        return await original(messages, tools)
    model.complete = timed
    supervisor = Supervisor()
    channel = await wechat(config, store, supervisor)
    app = build(config, store, key=key, llm=model, channels=[channel], primary=channel, supervisor=supervisor)
    image = b"\x89PNG\r\n\x1a\n" + os.urandom(5 * 1024 * 1024 - 8)
    times = []
    try:
        await channel.start(app.router.deliver)
        for round_ in range(6):
            aes = os.urandom(16)
            server.files[f"bench-{round_}"] = encrypt(aes, image)
            media = {"encrypt_query_param": f"bench-{round_}"}
            count = len(asked)
            start = time.perf_counter()
            server.message(items=[{"type": 2, "image_item": {"media": media, "aeskey": aes.hex()}}])
            while len(asked) == count:
                await asyncio.sleep(0.001)
            times.append(asked[-1] - start)
            while app.router.dispatching:
                await asyncio.sleep(0.01)
    finally:
        await channel.stop()
        await app.router.cancel()
        await app.mcp.close()
        await store.close()
        server.close()
        await asyncio.to_thread(drop_schema, schema_name)
        shutil.rmtree(tmp, ignore_errors=True)
    median = statistics.median(times[1:]) * 1000        # the first warms the imports (cryptography, base64)
    report(f"media: an inbound 5 MB image, message -> model request {median:.0f} ms median of {len(times) - 1} "
           f"(download, decrypt, inbox, image part; target <= 300 ms)", median <= 300)


MEMORIES = 10_000


def bench_memory() -> None:
    """10,000 memories of one owner: the system prompt's memory lines (<= 1,500 characters) and the
    selection per turn (<= 20 ms), from the index loaded once."""
    import random
    from tests.support import drop_schema, fresh_schema_dsn
    from ias.approval import load_key
    from ias.auditchain import AuditChain
    from ias.limits import MEMORY_PROMPT_MAX
    from ias.memory import Memory
    from ias.store import Store

    people = ["我", "老婆", "儿子", "女儿", "妈妈", "爸爸", "同事老王", "邻居张姐", "岳父", "小姨"]
    facts = ["喜欢吃{}", "不吃{}", "对{}过敏", "生日是{}月{}日", "住在{}", "每周{}去健身房", "的车牌是鲁A{}",
             "在{}上班", "周末常去{}", "想买{}"]
    things = ["红烧肉", "花生", "海鲜", "济南", "历下区", "泉城广场", "千佛山", "乌龙茶", "羽毛球拍", "新手机", "大明湖"]
    rng = random.Random(27)

    def fact() -> str:
        template = rng.choice(facts)
        values = [rng.choice(things) if rng.random() < 0.7 else str(rng.randint(1, 12)) for _ in range(template.count("{}"))]
        return rng.choice(people) + template.format(*values) + f"（第{rng.randint(1, 9999)}条）"

    async def run(dsn: str, chain) -> tuple[int, list[float], float]:
        store = await Store.open(dsn, chain=chain)
        try:
            async with store._conn() as conn:            # the rows as the daemon would find them after a year
                async with conn.cursor().copy("COPY memories (user_id, text, source, status, tainted) FROM STDIN") as copy:
                    for _ in range(MEMORIES):
                        await copy.write_row(("owner", fact(), "owner", "active", False))
            memory = Memory(store)
            start = time.perf_counter()
            await memory.block("owner", "warm up")         # the one load, at the owner's first turn
            load = time.perf_counter() - start
            longest, times = 0, []
            for query in ["我老婆生日是哪天", "儿子对什么过敏", "周末去哪里玩", "提醒我给妈妈打电话", "what is my wifi password",
                          "我想买什么来着"] * 5:
                start = time.perf_counter()
                block = await memory.block("owner", query)
                times.append(time.perf_counter() - start)
                longest = max(longest, len("\n".join(block.splitlines()[1:])))
            return longest, times, load
        finally:
            await store.close()

    tmp = Path(tempfile.mkdtemp(prefix="ias-bench-memory-"))
    dsn, schema_name = fresh_schema_dsn()
    try:
        chain = AuditChain.derive(load_key(tmp / "secret.key"), tmp / "audit.head")
        longest, times, load = asyncio.run(run(dsn, chain))
    finally:
        drop_schema(schema_name)
        shutil.rmtree(tmp, ignore_errors=True)
    report(f"memory: {MEMORIES:,} memories -> {longest} characters of memory lines in the prompt (target <= "
           f"{MEMORY_PROMPT_MAX})", longest <= MEMORY_PROMPT_MAX)
    worst, median = max(times) * 1000, statistics.median(times) * 1000
    report(f"memory: selection over {MEMORIES:,} memories {median:.1f} ms median, {worst:.1f} ms worst "
           f"(index loaded once in {load * 1000:.0f} ms; target <= 20 ms)", median <= 20)


def _all_tools_bytes(root: Path) -> int:
    from ias.catalog import Catalog
    _, size = Catalog(load_registry(REPO / "resources/skills", root), 128, 1 << 30).totals()
    return size


def main() -> int:
    print(f"iAs bench on {os.cpu_count()} cores, Python {sys.version.split()[0]}", flush=True)
    # Bytecode compiled, as an installed copy has it (with PYTHONDONTWRITEBYTECODE an edited module would be
    # compiled again by every command measured).
    import compileall
    compileall.compile_dir(REPO / "ias", quiet=1)
    bench_registry()
    bench_validator()
    bench_cold_start()
    asyncio.run(bench_gate())
    asyncio.run(bench_mcp())
    asyncio.run(bench_media())
    bench_once()
    bench_agent()
    bench_footprint()
    bench_scale()
    bench_retention()
    bench_memory()
    missed = [line for line, ok in RESULTS if not ok]
    print(f"\n{len(RESULTS) - len(missed)} of {len(RESULTS)} figures within target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
