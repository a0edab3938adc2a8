// Rounds: a live list (new rounds arrive over the rounds stream), each opening to its offer,
// standings, bids and outcome. Other tenants' apps and bids arrive anonymised from the API.

import { get } from './api.js';
import { appColour, appLabel, gpuList, h, place, rho, table, time } from './ui.js';

const LIST_LENGTH = 200;

export async function showRounds(container, context, roundId) {
  const list = h('ol', { class: 'list rounds-list', id: 'round-list', 'aria-label': 'Rounds, newest first' });
  const detail = h('div', { id: 'round-detail' });
  container.replaceChildren(
    h('h2', { tabindex: '-1' }, 'Rounds'),
    h('div', { class: 'split' }, list, detail));
  const rounds = await get('/v1/rounds?limit=50');
  list.append(...rounds.map((round) => roundItem(round, roundId)));
  if (roundId != null) await renderRound(detail, context, roundId);
  else detail.replaceChildren(h('p', { class: 'hint' }, 'Choose a round to see its offer, bids and outcome. New rounds appear at the top as they are decided.'));
  return {
    live: true,
    update(round) {
      const item = roundItem(round, roundId);
      const existing = list.querySelector(`[data-round="${round.round_id}"]`)?.closest('li');
      if (existing) existing.replaceWith(item);
      else list.prepend(item);
      while (list.children.length > LIST_LENGTH) list.lastElementChild.remove();
    },
  };
}

function roundItem(round, selected) {
  const gpus = round.gpus_won_in_auction + round.gpus_as_leftovers;
  return h('li', {}, h('a', { href: `#/rounds/${round.round_id}`, 'data-round': round.round_id,
    'aria-current': round.round_id === selected ? 'true' : null },
  h('span', { class: 'title' }, `Round ${round.round_id}`),
  h('span', { class: 'meta' }, `${time(round.opened_at)} · ${round.offered_gpus} GPUs offered · ${round.bidders} bidders · ${gpus} handed out · ${round.status}`)));
}

async function renderRound(detail, context, roundId) {
  const round = await get(`/v1/rounds/${roundId}`);
  const label = (appId) => appLabel(appId, context.appsById);
  const swatch = (appId) => h('span', { class: 'swatch', style: `background:${appColour(appId).fill}` });
  detail.replaceChildren(
    h('h3', {}, `Round ${round.round_id} (${round.status})`),
    h('p', {}, `Opened ${time(round.opened_at)}, bids due ${time(round.deadline)}, decided ${time(round.closed_at)}. `,
      `Fairness knob f = ${round.fairness_knob}, seed ${round.seed}, engine ${round.engine_version}.`),
    h('p', {}, h('strong', {}, 'Offered: '), gpuList(round.offered_gpus)),
    h('div', { class: 'table-wrap' }, table('Standings at round start (position 1 is the worst off; the first ones are offered GPUs)',
      ['Position', 'App', 'ρ at round start', 'Unmet demand', 'Offered?'],
      round.standings.map((standing) => h('tr', {},
        h('td', { class: 'num' }, place(standing.position)),
        h('td', {}, swatch(standing.app_id), label(standing.app_id)),
        h('td', { class: 'num' }, rho(standing.rho)),
        h('td', { class: 'num' }, standing.unmet_demand),
        h('td', {}, standing.bidder ? 'yes' : 'no'))))),
    h('h3', {}, 'Bids'),
    round.bids.length ? h('div', { id: 'round-bids' }, round.bids.map((bid) => bidSection(bid, round, label, swatch)))
      : h('p', {}, 'No bids.'),
    h('div', { class: 'table-wrap' }, table('Outcome: proportional-fair choice, hidden payment c_i, GPUs kept and leftovers',
      ['App', 'PF bundle', 'c_i', 'Kept', 'Leftovers'],
      round.allocations.map((allocation) => h('tr', {},
        h('td', {}, swatch(allocation.app_id), label(allocation.app_id)),
        h('td', {}, allocation.pf_entry == null ? gpuList(allocation.pf_gpus) : `#${allocation.pf_entry + 1}: ${gpuList(allocation.pf_gpus)}`),
        h('td', { class: 'num' }, allocation.c == null ? '–' : allocation.c.toFixed(3)),
        h('td', {}, gpuList(allocation.kept_gpus)),
        h('td', {}, gpuList(allocation.leftover_gpus)))),
      { id: 'round-outcome' })),
    h('p', {}, h('strong', {}, 'Not handed out: '), gpuList(round.unallocated)));
}

function bidSection(bid, round, label, swatch) {
  const chosen = round.allocations.find((allocation) => allocation.app_id != null && allocation.app_id === bid.app_id)?.pf_entry;
  const heading = h('p', {}, swatch(bid.app_id), h('strong', {}, label(bid.app_id)),
    ` · ${bid.source} · received ${time(bid.received_at)}`, bid.app_id == null ? '' : ` · ρ if it gets nothing (ρ_old) ${rho(bid.rho_old)}`);
  if (bid.app_id == null) {
    return h('section', { class: 'bid', 'data-app': 'other' }, heading, h('p', { class: 'hint' }, 'Another tenant’s bid: its bundles are not shown.'));
  }
  return h('section', { class: 'bid', 'data-app': bid.app_id }, heading,
    h('div', { class: 'table-wrap' }, table('Bid table', ['#', 'GPUs', 'ρ if won'],
      bid.entries.map((entry, index) => h('tr', { class: index === chosen ? 'chosen' : null, 'data-entry': index },
        h('td', {}, index + 1, index === chosen ? ' (PF choice)' : ''),
        h('td', {}, gpuList(entry.gpus)),
        h('td', { class: 'num' }, entry.rho.toFixed(3)))))));
}
