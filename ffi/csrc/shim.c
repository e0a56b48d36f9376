#include <stdio.h>
#include <stdlib.h>

#include <rte_config.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_prefetch.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ethdev.h>

#include "shim.h"

uint16_t sluice_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t sluice_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n)
{
	return rte_eth_tx_burst(port, queue, pkts, n);
}

int sluice_pktmbuf_alloc_bulk(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int n)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, n);
}

struct rte_mbuf *sluice_pktmbuf_alloc(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

void sluice_pktmbuf_free(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void sluice_prefetch0(const void *p)
{
	rte_prefetch0(p);
}

unsigned int sluice_lcore_id(void)
{
	return rte_lcore_id();
}

int sluice_errno(void)
{
	return rte_errno;
}

uint64_t sluice_rdtsc(void)
{
	return rte_rdtsc();
}

unsigned int sluice_ring_enqueue_burst(struct rte_ring *r, void *const *objs, unsigned int n)
{
	return rte_ring_enqueue_burst(r, objs, n, NULL);
}

unsigned int sluice_ring_dequeue_burst(struct rte_ring *r, void **objs, unsigned int n)
{
	return rte_ring_dequeue_burst(r, objs, n, NULL);
}

unsigned int sluice_ring_count(const struct rte_ring *r)
{
	return rte_ring_count(r);
}

static FILE *capture_stream;
static char *capture_buf;
static size_t capture_len;

int sluice_log_capture_start(void)
{
	if (capture_stream != NULL)
		return -1;
	capture_stream = open_memstream(&capture_buf, &capture_len);
	if (capture_stream == NULL)
		return -1;
	return rte_openlog_stream(capture_stream);
}

char *sluice_log_capture_stop(void)
{
	char *out;

	if (capture_stream == NULL)
		return NULL;
	rte_openlog_stream(NULL);
	fclose(capture_stream);
	capture_stream = NULL;
	out = capture_buf;
	capture_buf = NULL;
	capture_len = 0;
	return out;
}

void sluice_free(void *p)
{
	free(p);
}
