"""The course's tooling, around the four views: what the notebooks and the book's pages use.

- ``attnopt.course.explore`` computes what each explorer shows; ``attnopt.course.widgets`` puts it
  on sliders in a notebook; ``attnopt.course.page_explorer`` draws it as frames on the book's pages;
- ``attnopt.course.book``: devices, seeds, test data, checks and results for every notebook;
- ``attnopt.course.plotting``: the book's figure style;
- ``attnopt.course.pretrained``: the offline pretrained Transformer of chapter 1's Fig. 4;
- ``attnopt.course.vqa_data`` and ``attnopt.course.vqa``: the synthetic VQA task of chapter 4 and
  its models.

The views (``attnopt.fenchel``, ``attnopt.kernels``, ``attnopt.transforms``, ``attnopt.continuous``)
never import this package; each of its modules is also importable by its short name
(``attnopt.book``, ``attnopt.widgets``, ...).
"""
