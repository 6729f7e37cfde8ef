# nbgrader configuration of the course's assignments (https://nbgrader.readthedocs.io).
# This folder is the course directory: source/<assignment>/<notebook>.ipynb are the versions with
# solutions and hidden tests. `make assignments` copies it to _build/assignments and runs
# `nbgrader generate_assignment` there; the release versions land in _build/assignments/release/.
c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "attention-as-optimization"
# Each notebook runs in a few seconds on a laptop CPU; a cell that takes a minute is stuck.
c.Execute.timeout = 60
