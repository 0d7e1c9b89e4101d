"""The env file: its syntax (what systemd's EnvironmentFile= and a shell agree on), the owner check, the
atomic write that keeps the lines it does not set; and config.load reading it below the environment."""
import os
import stat
import tempfile
import unittest
from pathlib import Path

from ias import envfile
from ias.config import load
from ias.errors import ConfigError


class ParseTest(unittest.TestCase):
    def test_lines_comments_and_quotes(self):
        text = ("# iAs settings\n\nOPENAI_API_KEY=sk-abc\n  IAS_MODEL = qwen-plus  \nexport A='x y # not a comment'\n"
                'B="say \\"hi\\" \\\\ \\$HOME"\nC=\nD=a=b\n#E=1\nOPENAI_API_KEY=sk-later\n')
        self.assertEqual(envfile.parse(text), {
            "OPENAI_API_KEY": "sk-later", "IAS_MODEL": "qwen-plus", "A": "x y # not a comment",
            "B": 'say "hi" \\ $HOME', "C": "", "D": "a=b"})

    def test_a_bad_line_is_named_by_file_and_line(self):
        for text, problem in [("A=1\nnot a setting\n", "f.env:2: not KEY=VALUE"),
                              ("A=1\n\n1ABC=2\n", "f.env:3: '1ABC' is not a variable name"),
                              ('A="open\n', "f.env:1: A: the value's \" is not closed"),
                              ("A='x' y\n", "f.env:1: A: text after the closing '"),
                              ("A=\0\n", "f.env:1: A: a NUL character")]:
            with self.subTest(text=text), self.assertRaises(ConfigError) as caught:
                envfile.parse(text, "f.env")
            self.assertEqual(str(caught.exception), problem)

    def test_what_quoted_writes_reads_back_the_same(self):
        for value in ["sk-abc", "http://127.0.0.1:8080/v1", "", "a b", 'q"uote', "back\\slash", "$HOME", "#x",
                      "'single'", "中文", "Qwen/Qwen2.5-7B-Instruct"]:
            with self.subTest(value=value):
                self.assertEqual(envfile.parse(f"K={envfile.quoted(value)}\n"), {"K": value})


class FileTest(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-envfile-")
        self.addCleanup(tmp.cleanup)
        self.dir = Path(tmp.name)
        self.path = self.dir / "var" / "ias.env"

    def test_write_creates_a_0600_file_and_its_directory(self):
        envfile.write(self.path, {"OPENAI_API_KEY": "sk-1", "IAS_MODEL": "m one"})
        self.assertEqual(stat.S_IMODE(self.path.stat().st_mode), 0o600)
        self.assertEqual(envfile.read(self.path), {"OPENAI_API_KEY": "sk-1", "IAS_MODEL": "m one"})
        self.assertEqual([p.name for p in self.path.parent.iterdir()], ["ias.env"])     # no temporary left

    def test_write_keeps_other_lines_and_replaces_its_own(self):
        self.path.parent.mkdir()
        self.path.write_text("# mine\nQWEATHER_API_KEY=qw\nOPENAI_API_KEY=old\nIAS_MODEL=a\nOPENAI_API_KEY=older\n\n")
        self.path.chmod(0o600)
        envfile.write(self.path, {"OPENAI_API_KEY": "new", "OPENAI_BASE_URL": "http://h/v1"})
        self.assertEqual(self.path.read_text(), "# mine\nQWEATHER_API_KEY=qw\nOPENAI_API_KEY=new\nIAS_MODEL=a\n"
                                                "OPENAI_BASE_URL=http://h/v1\n")

    def test_write_refuses_a_value_with_a_line_break(self):
        with self.assertRaises(ConfigError):
            envfile.write(self.path, {"OPENAI_API_KEY": "sk\nIAS_DATA_DIR=/"})
        self.assertFalse(self.path.exists())

    def test_a_missing_file_is_empty(self):
        self.assertEqual(envfile.read(self.path), {})

    def test_a_file_others_may_write_is_refused(self):
        envfile.write(self.path, {"A": "1"})
        for mode in (0o620, 0o602, 0o666):
            self.path.chmod(mode)
            with self.subTest(mode=oct(mode)), self.assertRaises(ConfigError) as caught:
                envfile.read(self.path)
            self.assertIn(f"run chmod 600 {self.path}", str(caught.exception))
        self.path.chmod(0o644)              # readable by others is the owner's choice; writable is not
        self.assertEqual(envfile.read(self.path), {"A": "1"})

    def test_a_file_of_another_user_is_refused(self):
        envfile.write(self.path, {"A": "1"})
        info = os.stat(self.path)
        other = os.stat_result((info.st_mode, *info[1:4], 12345, *info[5:]))
        with self.assertRaises(ConfigError) as caught:
            envfile.check_owner(self.path, other)
        self.assertIn("belongs to another user (uid 12345)", str(caught.exception))
        envfile.check_owner(self.path, os.stat_result((info.st_mode, *info[1:4], 0, *info[5:])))    # root's: fine

    def test_a_symlink_is_not_followed(self):
        target = self.dir / "elsewhere.env"
        target.write_text("A=1\n")
        self.path.parent.mkdir()
        self.path.symlink_to(target)
        with self.assertRaises(ConfigError):
            envfile.read(self.path)


class LoadTest(unittest.TestCase):
    """config.load: the env file of the data directory, below the real environment."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="ias-envfile-")
        self.addCleanup(tmp.cleanup)
        self.dir = Path(tmp.name).resolve()
        cwd = os.getcwd()
        self.addCleanup(os.chdir, cwd)
        os.chdir(self.dir)

    def test_the_default_data_directory_s_file_is_read_and_the_environment_wins(self):
        envfile.write(self.dir / "var" / "ias.env", {"OPENAI_API_KEY": "sk-file", "IAS_MODEL": "file-model",
                                                     "QWEATHER_API_KEY": "qw"})
        config = load(environ={"IAS_MODEL": "env-model"})
        self.assertEqual((config.openai_api_key, config.model), ("sk-file", "env-model"))
        self.assertEqual(config.environ["QWEATHER_API_KEY"], "qw")      # a skill's variables come from it too
        self.assertEqual(config.env_file, self.dir / "var" / "ias.env")

    def test_the_data_directory_comes_from_the_environment_or_ias_toml_never_the_file(self):
        envfile.write(self.dir / "state" / "ias.env", {"IAS_MODEL": "state-model", "IAS_DATA_DIR": "/elsewhere"})
        config = load(environ={"IAS_DATA_DIR": "state"})
        self.assertEqual((config.model, config.data_dir), ("state-model", self.dir / "state"))
        (self.dir / "ias.toml").write_text('data_dir = "state"\n')
        self.assertEqual(load(environ={}).model, "state-model")

    def test_a_bad_file_is_one_config_error(self):
        path = self.dir / "var" / "ias.env"
        envfile.write(path, {"A": "1"})
        with open(path, "a") as out:
            out.write("oops\n")
        with self.assertRaises(ConfigError) as caught:
            load(environ={})
        self.assertEqual(str(caught.exception), f"{path}:2: not KEY=VALUE")


if __name__ == "__main__":
    unittest.main()
