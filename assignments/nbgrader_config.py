# nbgrader configuration of the course's assignments (https://nbgrader.readthedocs.io).
# This folder holds what is written by hand: source/<assignment>/<notebook>.ipynb (the instructor's
# versions) and grading/ (coursework.py, the checks' helpers that ship with every assignment, and
# hidden_checks.py, the hidden checks). `make assignments` copies them to the course directory
# _build/assignments and runs `nbgrader generate_assignment` there; the release versions land in
# _build/assignments/release/. Every path below is relative to the course directory (this file's
# folder once copied), so the documented commands work as written from inside it.
import os

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)
here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.course_id = "attention-as-optimization"
c.CourseDirectory.root = here
# Each notebook runs in a few seconds on a laptop CPU; a cell that takes a minute is stuck.
c.Execute.timeout = 60
# Starting a kernel (and importing PyTorch) can take most of a minute on a busy machine.
c.Execute.startup_timeout = 180

# autograde: the student's code runs in a sandbox, the checks here (grading/autograde_sandbox.py).
# nbgrader's Execute step (one Jupyter kernel, started as you, running checks and submission
# together) is replaced by SandboxedExecute: the student's cells run in a bubblewrap sandbox with no
# network, no access to this folder (secret, grading/, source/, gradebook, other submissions) and
# without the library attnopt; the locked cells, matched word for word against the gradebook, run
# in nbgrader's own process and call the student's functions in the sandbox, so nothing a
# submission does to its own process changes its score. Where no sandbox works, autograde stops and
# says why; `c.SandboxedExecute.allow_unsandboxed = True` grades anyway, without isolation (only for
# submissions you trust).
import sys  # noqa: E402

sys.dont_write_bytecode = True  # nothing is written into grading/ (its files stay as make assignments left them)
sys.path.insert(0, os.path.join(here, "grading"))
from autograde_sandbox import SandboxedExecute  # noqa: E402
from nbgrader.converters.autograde import Autograde  # noqa: E402
from nbgrader.preprocessors import Execute  # noqa: E402

c.Autograde.autograde_preprocessors = [
    SandboxedExecute if step is Execute else step for step in Autograde.class_traits()["autograde_preprocessors"].default()
]
assert SandboxedExecute in c.Autograde.autograde_preprocessors, "nbgrader's Execute step not found"
c.SandboxedExecute.course_directory = here
c.SandboxedExecute.timeout = 60
c.SandboxedExecute.allow_unsandboxed = False

# The exchange (release_assignment, fetch_assignment, submit, collect, release_feedback,
# fetch_feedback): a folder every student can write to. By default the course directory's
# exchange/; on a shared JupyterHub set ATTNOPT_EXCHANGE to a folder all users share (the
# students' nbgrader must use the same one, e.g. with a system-wide /etc/jupyter/nbgrader_config.py).
c.Exchange.root = os.environ.get("ATTNOPT_EXCHANGE", os.path.join(here, "exchange"))

# zip_collect: the files downloaded from a learning platform, extracted under
# downloaded/<assignment>/extracted/ (or zipped under downloaded/<assignment>/archive/), must be named
# <student id>_<anything>_<notebook>.ipynb or <student id>_<notebook>.ipynb, e.g.
# s1234567_attempt_2026-10-01_ch3_one_sided_eot.ipynb: the student id is the text before the first
# underscore, the notebook the name of one of the course's notebooks at the end.
c.ZipCollectApp.collector_plugin = "nbgrader.plugins.zipcollect.FileNameCollectorPlugin"
c.FileNameCollectorPlugin.named_regexp = (
    r".*/(?P<student_id>[^/_]+)_(?:[^/]*_)?(?P<file_id>ch\d_[a-z0-9_]+\.ipynb)$"
)

# release_feedback: nbgrader 0.9.6 stops with FileNotFoundError on a submission that did not come
# through the exchange (zip_collect, copied by hand: no submission_secret.txt). Those students could
# not fetch feedback from the exchange anyway; skip them, say so, and release the others' feedback.
from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback  # noqa: E402


class ReleaseExchangeFeedback(ExchangeReleaseFeedback):
    def copy_files(self):
        import glob

        skipped = sorted({
            os.path.basename(os.path.dirname(os.path.dirname(html)))
            for html in glob.glob(os.path.join(self.src_path, "*.html"))
            if not os.path.exists(os.path.join(os.path.dirname(html), "submission_secret.txt"))
        })
        if skipped:
            self.log.warning(
                "Not released through the exchange (their submissions did not come through it; hand "
                "out feedback/<student>/%s/ through your learning platform): %s",
                self.coursedir.assignment_id, ", ".join(skipped))
            excluded = set(filter(None, self.coursedir.student_id_exclude.split(","))) | set(skipped)
            self.coursedir.student_id_exclude = ",".join(sorted(excluded))
        super().copy_files()


c.ExchangeFactory.release_feedback = ReleaseExchangeFeedback
