//! Zero-half cuts for the payments' LP relaxations.
//!
//! Without its payer, a component's LP optimum is most often fractional along odd cycles:
//! members split between two bundles, each GPU shared by two of them (values of 1/3 and 2/3,
//! 2/7 and 5/7 in the `starving` family). No clique of the conflict graph is violated there,
//! but half the sum of an odd set of tight packing rows, rounded down, is: a {0,1/2}-Chvátal-
//! Gomory cut. When every fractional column meets the chosen rows an even number of times,
//! the cut is violated by exactly 1/2, and finding such a set is linear algebra over GF(2).
//! Every cut is implied by the packing rows and integrality alone, so it holds for every
//! choice of the component whoever is left out, and every payer of a group can keep it.

/// A packing row: `terms` (column, coefficient) sum to at most `bound`; also the form of a cut.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PackingRow {
    pub bound: u32,
    pub terms: Vec<(usize, u32)>,
}

/// How far a row's activity may sit below its bound and still count as tight, and how much a
/// cut must be violated to be worth adding.
const TOLERANCE: f64 = 1e-6;

/// At most `most` zero-half cuts that `values` violates by 1/2, from the rows it leaves tight.
/// Each cut is the sum of an odd-bounded set of tight rows in which every fractional column
/// has an even coefficient, halved and rounded down. Deterministic in the rows' and columns'
/// order.
pub(super) fn zero_half_cuts(rows: &[PackingRow], values: &[f64], most: usize) -> Vec<PackingRow> {
    let tight: Vec<&PackingRow> = rows.iter().filter(|row| is_tight(row, values)).collect();
    let parity = Parity::of_fractional_columns(&tight, values);
    let bound_of = |chosen: &[usize]| chosen.iter().map(|&row| tight[row].bound).sum::<u32>();
    let sets: Vec<Vec<usize>> = parity.even_sets().collect();
    // A set of even bound gives no cut by itself, but added to one of odd bound it does.
    let Some(odd) = sets.iter().find(|&set| bound_of(set) % 2 == 1) else {
        return Vec::new();
    };
    let odd_sets = sets.iter().map(|set| {
        if bound_of(set) % 2 == 1 {
            set.clone()
        } else {
            symmetric_difference(set, odd)
        }
    });
    let mut cuts = Vec::new();
    for chosen in odd_sets {
        if cuts.len() == most {
            break;
        }
        let cut = halved(chosen.iter().map(|&row| tight[row]), bound_of(&chosen));
        if cut.activity(values) > f64::from(cut.bound) + TOLERANCE && !cuts.contains(&cut) {
            cuts.push(cut);
        }
    }
    cuts
}

/// The rows in exactly one of two sets.
fn symmetric_difference(a: &[usize], b: &[usize]) -> Vec<usize> {
    let mut rows: Vec<usize> = a.iter().chain(b).copied().collect();
    rows.sort_unstable();
    let mut single = Vec::with_capacity(rows.len());
    let mut index = 0;
    while index < rows.len() {
        if rows.get(index + 1) == Some(&rows[index]) {
            index += 2;
        } else {
            single.push(rows[index]);
            index += 1;
        }
    }
    single
}

fn is_tight(row: &PackingRow, values: &[f64]) -> bool {
    row.activity(values) >= f64::from(row.bound) - TOLERANCE
}

impl PackingRow {
    fn activity(&self, values: &[f64]) -> f64 {
        (self.terms.iter())
            .map(|&(column, coefficient)| values[column] * f64::from(coefficient))
            .sum()
    }
}

/// Half the sum of `rows`, whose bounds sum to the odd `bound`, each coefficient and the bound
/// rounded down (columns are nonnegative, so rounding a coefficient down keeps the cut valid).
fn halved<'r>(rows: impl Iterator<Item = &'r PackingRow>, bound: u32) -> PackingRow {
    let mut terms: Vec<(usize, u32)> = rows.flat_map(|row| row.terms.iter().copied()).collect();
    terms.sort_unstable();
    let mut summed: Vec<(usize, u32)> = Vec::with_capacity(terms.len());
    for (column, coefficient) in terms {
        match summed.last_mut() {
            Some((last, total)) if *last == column => *total += coefficient,
            _ => summed.push((column, coefficient)),
        }
    }
    PackingRow {
        bound: bound / 2,
        terms: (summed.into_iter())
            .filter(|&(_, coefficient)| coefficient >= 2)
            .map(|(column, coefficient)| (column, coefficient / 2))
            .collect(),
    }
}

/// One equation over GF(2) per fractional column: the rows (as bits) where its coefficient is
/// odd, brought to reduced row echelon form.
struct Parity {
    rows: usize,
    equations: Vec<Vec<u64>>,
    /// The pivot row (bit) of each equation.
    pivots: Vec<usize>,
}

impl Parity {
    fn of_fractional_columns(tight: &[&PackingRow], values: &[f64]) -> Self {
        let words = tight.len().div_ceil(64);
        let mut by_column: Vec<Vec<u64>> = vec![Vec::new(); values.len()];
        for (row, packing) in tight.iter().enumerate() {
            for &(column, coefficient) in &packing.terms {
                let fractional = values[column] > TOLERANCE && values[column] < 1.0 - TOLERANCE;
                if coefficient % 2 == 1 && fractional {
                    let equation = &mut by_column[column];
                    equation.resize(words, 0);
                    equation[row / 64] ^= 1 << (row % 64);
                }
            }
        }
        let equations = by_column.into_iter().filter(|e| !e.is_empty()).collect();
        let mut parity = Self {
            rows: tight.len(),
            equations,
            pivots: Vec::new(),
        };
        parity.reduce();
        parity
    }

    fn reduce(&mut self) {
        let mut rank = 0;
        for bit in 0..self.rows {
            let (word, mask) = (bit / 64, 1u64 << (bit % 64));
            let Some(found) =
                (rank..self.equations.len()).find(|&e| self.equations[e][word] & mask != 0)
            else {
                continue;
            };
            self.equations.swap(rank, found);
            let pivot = self.equations[rank].clone();
            for (index, equation) in self.equations.iter_mut().enumerate() {
                if index != rank && equation[word] & mask != 0 {
                    for (bits, pivot_bits) in equation.iter_mut().zip(&pivot) {
                        *bits ^= pivot_bits;
                    }
                }
            }
            self.pivots.push(bit);
            rank += 1;
        }
        self.equations.truncate(rank);
    }

    /// A basis of the sets of rows that meet every fractional column an even number of times:
    /// one per row that is no equation's pivot, with the pivots it forces.
    fn even_sets(&self) -> impl Iterator<Item = Vec<usize>> + '_ {
        let mut is_pivot = vec![false; self.rows];
        for &pivot in &self.pivots {
            is_pivot[pivot] = true;
        }
        (0..self.rows)
            .filter(move |&row| !is_pivot[row])
            .map(|free| {
                let (word, mask) = (free / 64, 1u64 << (free % 64));
                let forced = (self.equations.iter().zip(&self.pivots))
                    .filter(|(equation, _)| equation[word] & mask != 0)
                    .map(|(_, &pivot)| pivot);
                std::iter::once(free).chain(forced).collect()
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use highs::{RowProblem, Sense};
    use proptest::prelude::*;

    fn row(bound: u32, terms: &[(usize, u32)]) -> PackingRow {
        PackingRow {
            bound,
            terms: terms.to_vec(),
        }
    }

    #[test]
    fn an_odd_cycle_of_pairs_gets_its_cut() {
        // Three GPUs, three bundles of two, each pair sharing one GPU: the LP takes each at
        // 1/2, and only one can be taken.
        let rows = [
            row(1, &[(0, 1), (2, 1)]),
            row(1, &[(0, 1), (1, 1)]),
            row(1, &[(1, 1), (2, 1)]),
        ];
        let cuts = zero_half_cuts(&rows, &[0.5, 0.5, 0.5], 10);
        assert_eq!(cuts, vec![row(1, &[(0, 1), (1, 1), (2, 1)])]);
    }

    #[test]
    fn an_even_cycle_or_an_integral_point_gets_none() {
        let square = [
            row(1, &[(0, 1), (1, 1)]),
            row(1, &[(1, 1), (2, 1)]),
            row(1, &[(2, 1), (3, 1)]),
            row(1, &[(3, 1), (0, 1)]),
        ];
        assert!(zero_half_cuts(&square, &[0.5; 4], 10).is_empty());
        assert!(zero_half_cuts(&square, &[1.0, 0.0, 1.0, 0.0], 10).is_empty());
    }

    #[test]
    fn members_split_across_a_nested_bundle_are_cut() {
        // Columns: A on GPU 0 (0) or GPU 1 (1); B on GPUs 0 and 1 (2) or GPU 2 (3); C on GPUs
        // 1 and 2 (4), its only bundle. A and B split half and half; GPU 2 is not full.
        let rows = [
            row(1, &[(0, 1), (1, 1)]),         // member A
            row(1, &[(2, 1), (3, 1)]),         // member B
            row(1, &[(0, 1), (2, 1)]),         // GPU 0
            row(1, &[(1, 1), (2, 1), (4, 1)]), // GPU 1
            row(1, &[(3, 1), (4, 1)]),         // GPU 2
        ];
        let cuts = zero_half_cuts(&rows, &[0.5, 0.5, 0.5, 0.5, 0.0], 10);
        // Member A with GPUs 0 and 1: C's coefficient of 1/2 rounds down to nothing.
        assert_eq!(cuts, vec![row(1, &[(0, 1), (1, 1), (2, 1)])]);
        assert_valid(&rows, &cuts[0], 5);
    }

    /// Every 0/1 point that meets `rows` meets `cut`.
    fn assert_valid(rows: &[PackingRow], cut: &PackingRow, columns: usize) {
        let meets = |row: &PackingRow, point: u32| {
            let activity: u32 = (row.terms.iter())
                .filter(|&&(column, _)| point & (1 << column) != 0)
                .map(|&(_, coefficient)| coefficient)
                .sum();
            activity <= row.bound
        };
        for point in 0..1u32 << columns {
            if rows.iter().all(|row| meets(row, point)) {
                assert!(
                    meets(cut, point),
                    "{cut:?} cuts off the integral point {point:#b}"
                );
            }
        }
    }

    fn lp_optimum(rows: &[PackingRow], costs: &[f64]) -> Vec<f64> {
        let mut problem = RowProblem::default();
        let columns: Vec<_> = costs
            .iter()
            .map(|&cost| problem.add_column(cost, 0..=1))
            .collect();
        for packing in rows {
            let terms = (packing.terms.iter()).map(|&(column, k)| (columns[column], f64::from(k)));
            problem.add_row(..=f64::from(packing.bound), terms);
        }
        let mut model = problem.optimise(Sense::Maximise);
        model.make_quiet();
        model.solve().get_solution().columns().to_vec()
    }

    fn packing_system() -> impl Strategy<Value = (Vec<PackingRow>, Vec<f64>)> {
        (4usize..=10).prop_flat_map(|columns| {
            let row = (
                1u32..=3,
                prop::collection::vec((0..columns, 1u32..=3), 2..=4),
            )
                .prop_map(|(bound, mut terms)| {
                    terms.sort_unstable();
                    terms.dedup_by_key(|term| term.0);
                    PackingRow { bound, terms }
                });
            (
                prop::collection::vec(row, 2..=8),
                prop::collection::vec(0.1f64..2.0, columns),
            )
        })
    }

    proptest! {
        /// On random packing systems, every cut separated from the LP optimum keeps every
        /// integral point and cuts the optimum off.
        #[test]
        fn cuts_keep_every_integral_point_and_cut_the_lp_optimum((rows, costs) in packing_system()) {
            let values = lp_optimum(&rows, &costs);
            for cut in zero_half_cuts(&rows, &values, 20) {
                assert_valid(&rows, &cut, costs.len());
                prop_assert!(cut.activity(&values) > f64::from(cut.bound) + TOLERANCE);
            }
        }
    }
}
