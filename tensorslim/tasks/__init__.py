"""Tasks: what is learned (data stream + loss + metrics). Importing this package registers every task."""

from tensorslim.tasks import (  # noqa: F401 - each module registers its task
    classify,
    distill,
    lm,
    longctx,
    mlm,
    segment,
)
from tensorslim.tasks.base import TASKS, Task, TaskData, get_task, register_task

__all__ = ["TASKS", "Task", "TaskData", "get_task", "register_task"]
