"""Episodes: the error budget and its counting rules, which episode a request continues
(header or conversation chaining), which tool results report failures, and where episode state
lives (in the process or in Redis, behind a guard that fails open)."""

from repairproxy._exports import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "BudgetSnapshot": "budget",
        "EpisodeRef": "budget",
        "EpisodeState": "budget",
        "EpisodeStore": "budget",
        "ErrorBudget": "budget",
        "MemoryEpisodeStore": "memory_store",
        "ChainIndex": "chaining",
        "ChainLink": "chaining",
        "MemoryChainIndex": "chaining",
        "ToolErrorDetector": "tool_errors",
        "MemoryResponsesStore": "responses_store",
        "ResponsesStore": "responses_store",
        "StoredResponse": "responses_store",
        "StoreHealth": "guard",
        "Stores": "store",
        "open_stores": "store",
    },
)
