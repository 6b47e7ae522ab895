"""``api:PROVIDER/MODEL[@DIM]``: hosted multimodal embedders (Voyage multimodal, Gemini
Embedding 2), early fusion.

Parsing is pure (no torch, no network): the model must be in :mod:`.catalog`, and ``@DIM`` one
of the output dimensions it offers (default: the model's own). The key comes from the
environment (``VOYAGE_API_KEY``, ``GEMINI_API_KEY``, read by the settings as ``API_KEYS``) and
is asked for when the first request is sent, so an audit served from the embedding cache or the
ledger needs none. The other settings are listed in :mod:`.client`. Every answer is kept in the
ledger of paid inputs (:mod:`.ledger`): an input paid for is never sent again.

Before a run, :mod:`.cost` estimates its calls and cost (``run_audit`` prints it and refuses a
run over ``--max-cost``); :mod:`.transport` keeps to the rate limits and retries faults.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from retrieval.retrievers.api.catalog import MODELS, PROVIDERS, ModelInfo, model_info
from retrieval.retrievers.api.client import ClientConfig
from retrieval.retrievers.base import Fusion, Retriever, RetrieverKind

__all__ = ["KIND", "ApiKind", "client_config", "ledger_root"]


def client_config(info: ModelInfo) -> ClientConfig:
    """The client configuration of ``info``'s model from the Django settings (see :mod:`.client`)."""
    from django.conf import settings

    return ClientConfig.for_model(
        info,
        key=settings.API_KEYS.get(info.provider, ""),
        base_url=settings.API_BASE_URLS.get(info.provider, ""),
        rpm=settings.API_RPM,
        tpm=settings.API_TPM,
        batch=settings.API_BATCH,
        max_tries=settings.API_MAX_TRIES,
        timeout_s=settings.API_TIMEOUT_S,
        max_request_mb=settings.API_MAX_REQUEST_MB,
    )


def ledger_root() -> Path:
    """Where the paid inputs are kept (the ``API_LEDGER_DIR`` setting)."""
    from django.conf import settings

    return Path(settings.API_LEDGER_DIR)


class ApiKind(RetrieverKind):
    prefix = "api"
    description = (
        "Hosted multimodal embedders (Voyage multimodal, Gemini Embedding 2): early fusion, paid per "
        "input; key from VOYAGE_API_KEY / GEMINI_API_KEY."
    )

    def parse(self, rest: str) -> dict[str, Any]:
        rest = (rest or "").strip()
        body, sep, dim_text = rest.partition("@")
        provider, slash, model = body.strip().partition("/")
        provider, model = provider.strip().lower(), model.strip()
        if not slash or not provider or not model:
            known = ", ".join(f"{p}/{m}" for p, m in sorted(MODELS))
            raise ValueError(f"expected PROVIDER/MODEL[@DIM] after 'api:' (known models: {known})")
        if provider not in PROVIDERS:
            raise ValueError(f"unknown API provider '{provider}'; known: {', '.join(PROVIDERS)}")
        info = model_info(provider, model)
        dim = info.dim
        if sep:
            dim_text = dim_text.strip()
            if not dim_text.isdigit() or int(dim_text) not in info.dims:
                raise ValueError(
                    f"'{dim_text}' is not an output dimension of {provider}/{model} "
                    f"(offered: {', '.join(map(str, info.dims))})"
                )
            dim = int(dim_text)
        canonical = f"api:{provider}/{model}" + (f"@{dim}" if dim != info.dim else "")
        return {"backend": "api", "provider": provider, "model": model, "dim": dim, "canonical": canonical}

    def fusion(self, parsed: dict[str, Any]) -> Fusion:
        return "early"

    def identity(
        self,
        parsed: dict[str, Any],
        *,
        device: str = "cpu",
        precision: str = "fp32",
        modality_rule: str = "family",
        **_: Any,
    ) -> dict[str, Any]:
        """spec, dim and template version without building (nothing to load: the model is remote)."""
        from retrieval.retrievers.api.providers import template_version

        return {
            "spec": parsed["canonical"],
            "dim": parsed["dim"],
            "template_version": template_version(parsed["provider"], modality_rule),
        }

    def build(
        self, parsed: dict[str, Any], *, device: str = "cpu", precision: str = "fp32", modality_rule: str = "family"
    ) -> Retriever:
        """The retriever (``device`` and ``precision`` do not apply: the model runs remotely);
        its client is made from the settings when it first needs to send."""
        from retrieval.retrievers.api.client import ApiClient
        from retrieval.retrievers.api.retriever import ApiRetriever

        info = model_info(parsed["provider"], parsed["model"])
        return ApiRetriever(
            parsed,
            ledger_root(),
            modality_rule=modality_rule,
            client=lambda: ApiClient(info, parsed["dim"], client_config(info)),
        )

    def estimate_cost(self, parsed: dict[str, Any], n_calls: int) -> float | None:
        """US dollars of ``n_calls`` inputs, each priced as one image of the largest billed
        size and a 16-token text (an upper bound; :func:`.cost.estimate` prices a dataset)."""
        from retrieval.retrievers.api.cost import per_input_usd

        return per_input_usd(model_info(parsed["provider"], parsed["model"])) * int(n_calls)

    def describe(self, parsed: dict[str, Any]) -> dict[str, Any]:
        info = model_info(parsed["provider"], parsed["model"])
        return {**super().describe(parsed), "dim": parsed["dim"], "price_source": info.source}


KIND = ApiKind()
