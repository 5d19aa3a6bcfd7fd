"""Tasks: what is learned (data stream + loss + metrics). Importing this package registers every task."""

from tensorslim.tasks import classify, distill, lm, mlm, segment  # noqa: F401 - each module registers its task
from tensorslim.tasks.base import TASKS, Task, TaskData, get_task, register_task

__all__ = ["TASKS", "Task", "TaskData", "get_task", "register_task"]
