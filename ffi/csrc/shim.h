/*
 * Real symbols for the DPDK 22.11 `static inline` functions and macros that
 * Sluice needs. Everything here is a one-line forward to DPDK; the bodies are
 * inlined into these wrappers by the C compiler, so each call costs one
 * ordinary function call (made once per burst, never per packet).
 */
#ifndef SLUICE_SHIM_H
#define SLUICE_SHIM_H

#include <stdint.h>
#include <stddef.h>

struct rte_mbuf;
struct rte_mempool;
struct rte_ring;

uint16_t sluice_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
uint16_t sluice_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n);
int sluice_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n);
int sluice_mbuf_raw_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n);
struct rte_mbuf *sluice_pktmbuf_alloc(struct rte_mempool *mp);
void sluice_pktmbuf_free(struct rte_mbuf *m);
void sluice_prefetch0(const void *p);
unsigned int sluice_lcore_id(void);
int sluice_errno(void);
uint64_t sluice_rdtsc(void);
unsigned int sluice_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned int n);
unsigned int sluice_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned int n);
unsigned int sluice_ring_count(const struct rte_ring *r);

/* Output capture around rte_eal_init (see shim.c). stop returns a malloc'ed
 * NUL-terminated buffer (free with sluice_free) or NULL. */
int sluice_capture_start(void);
char *sluice_capture_stop(void);
void sluice_free(void *p);

#endif
