"""Type-check the generated dashboards against Grafana's published types, ``tsc --strict``.

Grafana publishes its dashboard model as TypeScript (``@grafana/schema`` on npm: the
``Dashboard`` type, and each panel plugin's ``Options``/``FieldConfig``). This module
writes each dashboard's JSON as a TypeScript object literal typed with them, so ``tsc``
checks every key (an unknown one is an excess property), every enum value and every
required field::

    python -m dashboards.schema_check DIR   # DIR: where npm installed @grafana/schema
                                            # and typescript (npm install --prefix DIR)

The JSON stays JSON: string enums (``MappingType``, ``SpecialValueMatch``...) are
checked by their string values (:data:`PRELUDE`'s ``Json<T>``). Panels are checked by
their ``type`` against that plugin's types (timeseries, stat, table, heatmap); a panel of
another type fails. Prometheus targets (panels and annotations) are checked against
:data:`PROM_QUERY`, the fields of Grafana's Prometheus ``PromQuery`` the dashboards use
(the Prometheus plugin's own types are not in ``@grafana/schema``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from dashboards.generate import DASHBOARDS, render

#: the npm packages the check installs (pinned: a new Grafana release is a deliberate bump)
NPM_PACKAGES = ("@grafana/schema@13.2.3", "typescript@7.0.2")

_CFG = "@grafana/schema/dist/esm/raw/composable/{0}/panelcfg/x/{1}PanelCfg_types.gen"
_OWN = '"options" | "fieldConfig" | "targets" | "type"'  # typed per plugin below
PANELS = {"timeseries": "TimeSeries", "stat": "Stat", "table": "Table", "heatmap": "Heatmap"}

PROM_QUERY = """
// Grafana's Prometheus query (public/app/plugins/datasource/prometheus, dataquery.cue):
// the fields these dashboards set
interface PromQuery extends DataQuery {
  expr: string;
  legendFormat?: string;
  instant?: boolean;
  range?: boolean;
  format?: "time_series" | "table" | "heatmap";
  interval?: string;
  intervalFactor?: number;
  step?: string;
}
"""

PRELUDE = """
// JSON carries a string enum's value, not the enum: check it against the values
type Json<T> = T extends string
  ? `${T}`
  : T extends (infer U)[]
    ? Json<U>[]
    : T extends object
      ? { [K in keyof T]: Json<T[K]> }
      : T;
"""


def harness(name: str, dashboard_json: str) -> str:
    """The TypeScript of one dashboard, typed with Grafana's published types: each panel
    a constant of its plugin's panel type (so an error names the panel), the dashboard
    the ``Dashboard`` type with those panels."""
    d = json.loads(dashboard_json)
    panels = d.pop("panels", [])
    imports = [
        'import type { Dashboard, Panel, AnnotationQuery, DataQuery } from "@grafana/schema";'
    ]
    types = []
    for kind, cfg in PANELS.items():
        alias = f"{cfg}Cfg"
        imports.append(f'import type * as {alias} from "{_CFG.format(kind, cfg)}";')
        field = f"{alias}.FieldConfig" if kind != "stat" else "Record<string, unknown>"
        types.append(
            f"type {cfg}Panel = Json<Omit<Panel, {_OWN}>> & {{\n"
            f'  type: "{kind}";\n'
            f"  options: Json<Partial<{alias}.Options>>;\n"
            f"  fieldConfig: Json<{{ defaults: Omit<NonNullable<Panel['fieldConfig']>"
            f"['defaults'], 'custom'> & {{ custom?: Partial<{field}> }}; overrides: "
            f"NonNullable<Panel['fieldConfig']>['overrides'] }}>;\n"
            f"  targets: PromQuery[];\n"
            f"}};"
        )
    consts = []
    for i, p in enumerate(panels):
        kind = p.get("type")
        cfg = PANELS.get(kind, "Unknown")
        body = json.dumps(p, indent=2)
        consts.append(f"// panel {p.get('title')!r}\nconst panel{i}: {cfg}Panel = {body};")
    names = ", ".join(f"panel{i}" for i in range(len(panels)))
    return "\n".join(
        [
            *imports,
            PRELUDE,
            PROM_QUERY,
            *types,
            "type ProbePanel = " + " | ".join(f"{c}Panel" for c in PANELS.values()) + ";",
            'type ProbeDashboard = Json<Omit<Dashboard, "panels" | "annotations">> & {',
            "  panels: ProbePanel[];",
            "  annotations: { list: Json<AnnotationQuery<PromQuery>>[] };",
            "};",
            *consts,
            f"// {name}",
            f"export const dashboard: ProbeDashboard = "
            f"{{ ...{json.dumps(d, indent=2)}, panels: [{names}] }};",
            "",
        ]
    )


def write_harnesses(out_dir: Path, dashboards_dir: Path | None = None) -> list[Path]:
    """One ``.ts`` per dashboard in ``out_dir``: the committed JSON when
    ``dashboards_dir`` is given, else the JSON the generator makes now."""
    paths = []
    for fname, build in DASHBOARDS.items():
        text = (dashboards_dir / fname).read_text() if dashboards_dir else render(build())
        p = out_dir / (Path(fname).stem + ".ts")
        p.write_text(harness(fname, text))
        paths.append(p)
    return paths


def tsc(node_dir: Path, files: Sequence[Path]) -> subprocess.CompletedProcess[str]:
    """``tsc --strict --noEmit`` on ``files`` with the packages installed in ``node_dir``."""
    return subprocess.run(
        [
            str(node_dir / "node_modules" / ".bin" / "tsc"),
            "--strict",
            "--noEmit",
            "--skipLibCheck",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            "--target",
            "es2020",
            *map(str, files),
        ],
        cwd=node_dir,
        capture_output=True,
        text=True,
        timeout=600,
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dashboards.schema_check", description=__doc__)
    ap.add_argument(
        "node_dir", type=Path, help=f"npm install --prefix DIR {' '.join(NPM_PACKAGES)}"
    )
    args = ap.parse_args(argv)
    files = write_harnesses(args.node_dir)
    out = tsc(args.node_dir, files)
    sys.stdout.write(out.stdout + out.stderr)
    if out.returncode == 0:
        print(f"{len(files)} dashboards type-check against @grafana/schema (tsc --strict)")
    return out.returncode


if __name__ == "__main__":
    sys.exit(main())
