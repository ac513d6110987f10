"""The report: each table in the paper's layout, "ours (paper)", and where they agree."""

import io
import json
import math
import os
import sys
from typing import Optional

import numpy as np
import scipy.stats

from launch import papers
from launch.reproduce import plan as plan_lib
from launch.sweeps import comparison
import tasks
from tff_zmg import analysis
from tff_zmg import run_files

REPORT_FILENAME = 'report.md'
RESULTS_FILENAME = 'report.json'


def run_accuracy(rounds, acc, how: tuple[str, int]) -> float:
  """A run's accuracy as the paper scores it: mean of the last n rounds, or the best."""
  kind, n = how
  if kind == 'best':
    return float(np.max(acc))
  return analysis.mean_of_last_rounds(acc, rounds, n)


def _percent(value, std=None) -> str:
  if value is None:
    return analysis.NOT_REACHED
  if isinstance(value, float) and math.isnan(value):
    return 'nan'
  text = f'{100 * value:.2f}'
  return text if std is None or math.isnan(std) else f'{text} ± {100 * std:.2f}'


def _paper(value, percent=False) -> str:
  if value is None:
    return '—'
  return f'{value:.2f}' if percent else analysis.tables.format_value(float(value))


def _published_p(t: Optional[float], n: int) -> Optional[float]:
  """The two-sided p of a published paired t with n pairs (Student's t, n - 1 df)."""
  return None if t is None else float(2 * scipy.stats.t.sf(abs(t), n - 1))


def _ttest_row(ttests, a: str, b: str) -> Optional[dict]:
  for row in ttests:
    if row['metric'] == 'final_accuracy' and {row['algo_a'], row['algo_b']} == {a, b}:
      sign = 1 if row['algo_a'] == a else -1
      return {**row, 't': sign * row['t'], 'algo_a': a, 'algo_b': b}
  return None


def _best(values: dict, pick=max) -> list:
  """The keys whose value is the best (`pick` of the defined values): several on a tie."""
  defined = {k: v for k, v in values.items() if v is not None and not math.isnan(v)}
  if not defined:
    return []
  top = pick(defined.values())
  return [k for k, v in defined.items() if v == top]


def _agreement(what: str, ours: list, paper: list) -> str:
  """'what: ours A, the paper B (agree)'; ties are joined with ' = '."""
  verdict = 'agree' if set(ours) == set(paper) else 'differ'
  return f'{what}: ours {" = ".join(ours)}, the paper {" = ".join(paper)} ({verdict})'


def _summary_layout(plan, spec, table, setting_tables, thresholds_of):
  """FedZMG Tables 3-5: rounds to each threshold and the late-stage accuracy, per algorithm."""
  setting = spec.settings[0]
  tables_, (t1, t2) = setting_tables[setting.key], thresholds_of(setting)
  by_algo = {r['algo']: r for r in tables_['summary']} if tables_ else {}
  header = ['Algorithm', f'Rounds to {t1:g}', f'Rounds to {t2:g}', f'Avg Acc Post-{t2:g} (%)']
  rows, results, lines = [], {}, []
  for algo in plan.paper.algos:
    r = by_algo.get(algo, {})
    ours = {
        'rounds_to_t1': r.get(f'{analysis.comparison.rounds_column(t1)}_mean'),
        'rounds_to_t2': r.get(f'{analysis.comparison.rounds_column(t2)}_mean'),
        'late_stage_t2': r.get(f'{analysis.comparison.late_stage_column(t2)}_mean'),
    }
    results[algo] = {k: {'ours': v, 'paper': table.value(algo, k)} for k, v in ours.items()}
    paper = {k: _paper(table.value(algo, k), k == 'late_stage_t2') for k in ours}
    if not r:
      rows.append([algo] + [f'no runs ({paper[k]})' for k in ours])
      continue
    reached = [r[f'{analysis.comparison.rounds_column(t)}_reached'] for t in (t1, t2)]
    rows.append([algo] + [
        f'{analysis.tables.format_value(ours[k])} [{reached[i]}] ({paper[k]})'
        for i, k in enumerate(('rounds_to_t1', 'rounds_to_t2'))
    ] + [f'{_percent(ours["late_stage_t2"])} ({paper["late_stage_t2"]})'])
  for key, what, best in (('rounds_to_t2', 'fastest to the second threshold', min),
                          ('late_stage_t2', 'highest after the second threshold', max)):
    ours = _best({a: results[a][key]['ours'] for a in results}, best)
    paper = _best({a: results[a][key]['paper'] for a in results}, best)
    if not ours:
      lines.append(f'{what}: the paper has {" = ".join(paper)}; ours is undefined (not'
                   ' reached by every run at this scale)')
      continue
    lines.append(_agreement(what, ours, paper))
  return header, rows, results, lines


def _ttest_layout(plan, spec, table, setting_tables, thresholds_of):
  """FedZMG Tables 6-8: paired t-tests of the final accuracy, fedzmg against each baseline.

  The paper's p-values are not in our copy: beside ours stands the p its t gives with
  the paper's seeds as pairs.
  """
  del thresholds_of  # The final accuracy has none.
  tables_ = setting_tables[spec.settings[0].key]
  header = ['Comparison', 't-Statistic', 'p-Value', 'n']
  rows, results, lines = [], {}, []
  n_paper = len(plan.paper.seeds)
  for pair in table.rows:
    a, b = (x.strip() for x in pair.split(' vs '))
    r = _ttest_row(tables_['ttests'], a, b) if tables_ else None
    t_paper = table.value(pair, 't')
    p_from_t = _published_p(t_paper, n_paper)
    ours_t, ours_p, n = (r['t'], r['p'], r['n']) if r else (None, None, 0)
    results[pair] = {'t': {'ours': ours_t, 'paper': t_paper},
                     'p': {'ours': ours_p, 'paper': table.value(pair, 'p'),
                           'paper_from_t': p_from_t}, 'n': n}
    rows.append([
        pair, f'{_paper(ours_t)} ({_paper(t_paper)})',
        f'{_paper(ours_p)} (— ; ≈{p_from_t:.3g} from t, {n_paper} pairs)', str(n)])
    if r is None or ours_t is None or math.isnan(ours_t):
      lines.append(f'{pair}: no t-test of ours (fewer than two paired seeds, or no spread)')
      continue
    lines.append(
        f'{pair}: t = {ours_t:.3g} (paper {t_paper:g}): the sign'
        f' {"agrees" if (ours_t > 0) == (t_paper > 0) else "differs"}; significant at 0.05:'
        f' ours {"yes" if ours_p < 0.05 else "no"} (p = {ours_p:.3g}, n = {n}), the paper'
        f' {"yes" if p_from_t < 0.05 else "no"} (p ≈ {p_from_t:.3g} from its t)')
  return header, rows, results, lines


def _accuracy_layout(plan, spec, table, setting_tables, thresholds_of):
  """A row per algorithm, a column per setting: the paper's accuracy, mean ± std over seeds."""
  del thresholds_of  # Accuracy tables have none.
  header = ['Algorithm'] + [table.columns[s.key] for s in spec.settings]
  rows, results, lines = [], {}, []
  for algo in plan.paper.algos:
    row, results[algo] = [algo], {}
    for setting in spec.settings:
      tables_ = setting_tables[setting.key]
      accs = tables_['accuracy'].get(algo, []) if tables_ else []
      mean = float(np.mean(accs)) if accs else None
      std = float(np.std(accs, ddof=1)) if len(accs) > 1 else math.nan
      paper = table.value(algo, setting.key)
      results[algo][setting.key] = {'ours': mean, 'paper': paper, 'seeds': len(accs)}
      row.append(f'{"no runs" if mean is None else _percent(mean, std)}'
                 f' ({_paper(paper, True)})')
    rows.append(row)
  agree = 0
  for setting in spec.settings:
    ours = _best({a: results[a][setting.key]['ours'] for a in results})
    paper = _best({a: results[a][setting.key]['paper'] for a in results})
    if ours and paper:
      agree += set(ours) == set(paper)
      lines.append(_agreement(f'{table.columns[setting.key]}, best', ours, paper))
  lines.append(f'the best algorithm agrees in {agree} of {len(spec.settings)} columns')
  return header, rows, results, lines


_LAYOUTS = {'summary': _summary_layout, 'ttest': _ttest_layout, 'accuracy': _accuracy_layout}


def table_summary(plan, spec, setting_tables, thresholds_of):
  """(Markdown table, results dict, summary sentences) of one published table."""
  table = plan.paper.published[spec.number]
  header, rows, results, lines = _LAYOUTS[spec.layout](
      plan, spec, table, setting_tables, thresholds_of)
  markdown = analysis.markdown_table([dict(zip(header, row)) for row in rows], header)
  return markdown, results, lines


def tuning_section(plan: plan_lib.Plan, best: dict) -> list[str]:
  """'## Tuning': the search that ran (rungs: cells and rounds), each pick with the rounds
  its score averages, the stability check and any replacement, and the cost."""
  search = plan.search()
  if search is None:
    return []
  client, server, cohort = plan.grid_axes()
  cells = len(client) * len(server)
  grid = plan.paper.grid
  md = ['## Tuning\n\n',
        f'Each algorithm on each setting: {len(client)} client x {len(server)} server'
        f' learning rates, cohort {cohort}, {search.describe(cells)}; a cell scores the mean'
        f' validation accuracy of its last {search.score_rounds} rounds of a rung (all, when'
        f' fewer). The paper: {len(grid.client_learning_rates)} x'
        f' {len(grid.server_learning_rates)}, every cell {grid.total_rounds} rounds, the'
        f' last {grid.score_rounds} scored.'
        + (f' The pick is re-run with another seed for {search.final_rounds} rounds; if that'
           ' diverges, its best adjacent cell whose re-run does not replaces it.'
           if search.stability_check else '')
        + '\n\n']
  rows, total_rounds, total_seconds = [], 0, 0.0
  for (key, algo), record in best.items():
    stability = record.get('stability') or {}
    if stability.get('replaced'):
      old = stability['diverged_best']
      stable = (f'best client {old["client_learning_rate"]:.3g} / server'
                f' {old["server_learning_rate"]:.3g} diverged with seed {stability["seed"]};'
                ' replaced by its best stable neighbour')
    elif stability:
      stable = f'stable with seed {stability["seed"]}'
    else:
      stable = 'not checked'
    rows.append({
        'setting': key, 'algorithm': algo,
        'client lr': f'{record["client_learning_rate"]:.3g}',
        'server lr': f'{record["server_learning_rate"]:.3g}',
        'score': f'{record["score"]:.4f}',
        'rounds scored': f'{record["total_rounds"] - record["score_rounds"] + 1}-'
                         f'{record["total_rounds"]}',
        'rungs (cells x rounds)': ', '.join(f'{r["cells"]} x {r["rounds"]}'
                                            for r in record['rungs']),
        'stability': stable,
        'rounds trained': str(record['cost']['rounds']),
        'time in rounds': f'{record["cost"]["seconds"]:.0f} s',
    })
    total_rounds += record['cost']['rounds']
    total_seconds += record['cost']['seconds']
  md.append(analysis.markdown_table(rows, list(rows[0]) if rows else []))
  md.append(f'\nThe search trained {total_rounds} rounds in all ({total_seconds / 60:.1f}'
            ' min of training and evaluation, from the runs\' metrics.csv; process start-up'
            ' not counted).\n\n')
  return md


def communication_section(communication: dict) -> list[str]:
  """Each setting's algorithms, their aggregator and bytes per client and round, as
  `comparison.communication_by_algo` read them from the runs (none: no section)."""
  rows = [{'setting': key, 'algorithm': algo, **comparison.communication_cells(values)}
          for key, by_algo in communication.items() for algo, values in by_algo.items()]
  if not rows:
    return []
  return ['## Communication per client and round\n\n',
          'Measured from each run\'s round (`tff_zmg.aggregation.client_bytes`).\n\n',
          analysis.markdown_table(rows, list(rows[0])), '\n']


def _relative(plan: plan_lib.Plan, path: str) -> str:
  return os.path.relpath(path, plan.directory)


def _tuned(plan: plan_lib.Plan, best: dict, setting) -> dict:
  """(task, algo) -> the grid's pick of each algorithm on `setting` (`comparison.report`'s
  `tuned`), so that a picked rate is called tuned whatever its value."""
  task = plan.task(setting)
  return {
      (task, algo): analysis.TunedRates(
          task=task, algo=algo, hparams=analysis.tuning.hparams_of(record),
          score=record['score'],
          path=os.path.join(plan.directory, 'grid', key, algo, run_files.BEST))
      for (key, algo), record in best.items() if key == setting.key
  }


def _paper_rates(plan: plan_lib.Plan) -> Optional[dict]:
  """The learning rates the paper's protocol gives every method; None where it has none."""
  protocol = plan.paper.flags.get('protocol')
  if protocol is None:
    return None
  return {'client_learning_rate': papers.get_protocol(protocol).client_optimizer.learning_rate}


def client_optimizer_section(plan: plan_lib.Plan, trained: dict) -> list[str]:
  """'## How each algorithm trained': the protocol's client optimizer, and each
  algorithm's hyperparameters as its runs recorded them (`trained`: algo -> texts)."""
  md = ['## How each algorithm trained\n\n']
  protocol = plan.paper.flags.get('protocol')
  if protocol is not None:
    protocol = papers.get_protocol(protocol)
    md.append(f'`--protocol={protocol.name}` trains every method\'s clients with'
              f' {protocol.client_optimizer.describe()}'
              f' ({protocol.sources["client_optimizer"]}), each under its own names.\n\n')
  rows = [{'algorithm': algo, 'hyperparameters (its runs\' flags.json)':
           '; '.join(sorted(trained[algo])) if trained.get(algo) else 'no runs'}
          for algo in plan.paper.algos]
  md += [analysis.markdown_table(rows, list(rows[0])), '\n']
  return md


def write_report(plan: plan_lib.Plan, best: dict, heatmaps: dict, stream=None) -> str:
  """Collects every setting's runs, writes report.md and report.json; returns the path."""
  stream = stream or sys.stdout

  def thresholds_of(setting):
    """--thresholds, or the setting's task's when they are this paper's (none else)."""
    if plan.thresholds:
      return plan.thresholds
    spec = tasks.SPECS[setting.task]
    return spec.accuracy_thresholds if spec.thresholds_from == plan.paper.name else ()

  setting_tables, figures, communication, trained = {}, {}, {}, {}
  for setting in plan.settings:
    task = plan.task(setting)
    root = os.path.join(plan.directory, 'runs', setting.key)
    report_dir = os.path.join(plan.directory, 'compare', setting.key)
    tuned = _tuned(plan, best, setting)
    comparison.report(root, report_dir, [task], plan.paper.algos, plan.seeds,
                      thresholds_of(setting), stream=stream, tuned=tuned,
                      paper_rates=_paper_rates(plan),
                      titles={task: setting.describe(plan.data_source)})
    series, status_rows = comparison.collect(root, task, plan.paper.algos, plan.seeds,
                                             io.StringIO())
    for row in status_rows:
      trained.setdefault(row['algo'], set()).add(
          analysis.tuning.format_hparams(json.loads(row['hparams'])))
    communication[setting.key] = comparison.communication_by_algo(status_rows)
    figures[setting.key] = os.path.join(report_dir, f'{task}_accuracy.png')
    if not series:
      setting_tables[setting.key] = None
      continue
    tables_ = analysis.compare_runs(series, thresholds_of(setting))
    tables_['accuracy'] = {
        algo: [run_accuracy(r, a, plan.paper.accuracy) for _, (r, a) in sorted(s.items())]
        for algo, s in series.items()
    }
    setting_tables[setting.key] = tables_

  scale = plan.scale
  caveat = plan.tuning_caveat()
  md = [f'# Reproducing {plan.paper.title}\n\n']
  if caveat:
    md.append(f'**Not a result: the learning rates were not tuned honestly at this scale**'
              f' ({caveat}). The tables below exercise the pipeline only.\n\n')
  md += [
      f'Scale **{scale.name}**: {scale.description}. Data: **{plan.data_source}**'
      + ''.join(sorted({f' ({s.task} stood in for by synthetic {plan.task(s)} data, with'
                        f' its own model)' for s in plan.settings if plan.task(s) != s.task}))
      + '.'
      f' Comparison: {len(plan.paper.algos)} algorithms x {len(plan.seeds)} seeds'
      f' {list(plan.seeds)} x {len(plan.settings)} setting(s), {plan.total_rounds} rounds'
      f' (the paper: {len(plan.paper.seeds)} seeds, {plan.paper.total_rounds} rounds).',
  ]
  md.append('\n\nEach cell reads **ours (paper)**. Ours are means over our seeds.\n\n')
  results, summary = {}, []
  for spec in plan.tables:
    table = plan.paper.published[spec.number]
    markdown, cells, lines = table_summary(plan, spec, setting_tables, thresholds_of)
    results[str(spec.number)] = cells
    md += [f'## Table {spec.number}: {table.caption}\n\n',
           f'Source: {table.source}.\n\n', markdown, '\n']
    if spec.layout == 'summary':
      md.append('Rounds are the mean over seeds ("not reached" unless every seed reached'
                ' the threshold for good; [k/n] seeds reached it).\n\n')
    for note in table.notes:
      md.append(f'- {note}\n')
    md.append('\n')
    summary += [f'Table {spec.number}: {line}.' for line in lines]
  md += communication_section(communication)
  md.append('## Figures\n\n')
  for setting in plan.settings:
    if os.path.exists(figures[setting.key]):
      md.append(f'![{setting.key} accuracy]({_relative(plan, figures[setting.key])})\n\n')
  for (key, algo), path in heatmaps.items():
    rates = best.get((key, algo))
    chosen = ('every cell diverged' if rates is None else
              f'best client {rates["client_learning_rate"]:.3g}, server'
              f' {rates["server_learning_rate"]:.3g}')
    md.append(f'![{key} {algo} grid]({_relative(plan, path)}) ({key}, {algo}: {chosen})\n\n')
  md += tuning_section(plan, best)
  md.append('## Summary\n\n')
  md += [f'- {line}\n' for line in summary]
  closing = (
      f'These numbers come from the **{scale.name}** scale'
      + (' on **synthetic** data, which only exercises the pipeline: they say nothing about'
         ' the papers\' claims.' if plan.data_source == 'synthetic' else
         ('.' if scale.name == 'full' else
          ', fewer rounds, seeds or grid points than the paper: orderings can change with'
          ' the full protocol.'))
  )
  md.append(f'\n{closing}\n\n')
  md += client_optimizer_section(plan, trained)
  md.append('\n## Protocol choices\n\n')
  md += [f'- {note}\n' for note in plan.paper.notes]
  path = os.path.join(plan.directory, REPORT_FILENAME)
  with open(path, 'w') as f:
    f.write(''.join(md))
  with open(os.path.join(plan.directory, RESULTS_FILENAME), 'w') as f:
    json.dump(dict(paper=plan.paper.name, scale=scale.name, data_source=plan.data_source,
                   tables=results, tuned_honestly=caveat is None, tuning_caveat=caveat,
                   best_learning_rates={f'{k}/{a}': v for (k, a), v in best.items()}),
              f, indent=2)
  return path
