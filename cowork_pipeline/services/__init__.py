"""In-process workspace services. Importing this package registers every tool."""
from cowork_pipeline.services import calendar, chat, crm, directory, docs, helpdesk, mail, tasks  # noqa: F401  (registration)
from cowork_pipeline.services.registry import REGISTRY, Param, Tool, ToolError
from cowork_pipeline.services.workspace import FaultConfig, ToolResult, Workspace, diff_states, tools_for

SERVICES = ("mail", "calendar", "crm", "helpdesk", "docs", "chat", "tasks", "directory")

__all__ = ["REGISTRY", "SERVICES", "FaultConfig", "Param", "Tool", "ToolError", "ToolResult", "Workspace", "diff_states", "tools_for"]
