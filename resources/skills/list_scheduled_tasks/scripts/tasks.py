"""Scheduled tasks through `ias tasks … --json`: `tasks.py list` or `tasks.py manage`, parameters on stdin."""
import json
import os
import subprocess
import sys

ACTIONS = {"add": "add", "update": "update", "delete": "remove", "pause": "pause", "resume": "resume"}


def fail(message: str) -> None:
    print(json.dumps({"success": False, "error": message}, ensure_ascii=False))
    sys.exit(0)


def ias(*args: str):
    """Run the iAs CLI (same interpreter, same database) and parse its JSON answer."""
    home = os.environ.get("IAS_HOME")
    if not home:
        fail("IAS_HOME is not set: this skill must run under iAs")
    proc = subprocess.run([sys.executable, os.path.join(home, "ias.py"), "tasks", *args, "--json"],
                          capture_output=True, text=True, timeout=25)
    try:
        answer = json.loads(proc.stdout)
    except json.JSONDecodeError:
        fail((proc.stderr or proc.stdout).strip()[-500:] or f"ias tasks exited with {proc.returncode}")
    if proc.returncode != 0:
        fail(answer.get("error", "ias tasks failed") if isinstance(answer, dict) else "ias tasks failed")
    return answer


def manage(params: dict) -> dict:
    action = params["action"]
    if action == "add":
        missing = [k for k in ("name", "schedule", "text") if not params.get(k)]
        if missing:
            fail(f"add needs: {', '.join(missing)}")
        args = ["add", "--name", params["name"], "--schedule", params["schedule"],
                "--kind", params.get("kind", "reminder"), "--text", params["text"]]
    else:
        if "id" not in params:
            fail(f"{action} needs the task id (see list_scheduled_tasks)")
        args = [ACTIONS[action], str(params["id"])]
        if action == "update":
            changes = [(f"--{k}", str(params[k])) for k in ("name", "schedule", "kind", "text") if k in params]
            if not changes:
                fail("update needs at least one of name, schedule, kind, text")
            args += [part for pair in changes for part in pair]
    return {"success": True, "action": action, "task": ias(*args)}


def main() -> None:
    params = json.load(sys.stdin)
    if sys.argv[1:] == ["list"]:
        tasks = ias("list", *(["--all"] if params.get("include_disabled") else []))
        print(json.dumps({"success": True, "tasks": tasks}, ensure_ascii=False))
    else:
        print(json.dumps(manage(params), ensure_ascii=False))


if __name__ == "__main__":
    main()
